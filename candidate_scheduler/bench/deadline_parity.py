"""The elastic contract, checked on every reply: a group served n of its 8 candidates carries exactly
candidates 0..n-1 of the full group -- the same seeds, and bitwise the same actions as the first n of a
count-8 group of that seed run alone (`references`)."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.core import rng


def same_bits(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return False
    a, b = np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def check_replies(outcomes, references: dict[int, np.ndarray], count: int) -> dict:
    """Every `done` outcome against its seed's reference [count, horizon, D]."""
    checked = mismatched = wrong_seeds = 0
    examples = []
    for o in outcomes:
        if o.status != "done":
            continue
        checked += 1
        n = o.served_count if o.served_count is not None else count
        want_seeds = rng.candidate_seeds(o.seed, count, "per_candidate")[:n]
        if tuple(o.candidate_seeds) != tuple(want_seeds):
            wrong_seeds += 1
        if not same_bits(o.candidates, references[o.seed][:n]):
            mismatched += 1
            if len(examples) < 3:
                diff = None if o.candidates is None or o.candidates.shape != references[o.seed][:n].shape else \
                    float(np.max(np.abs(o.candidates.astype(np.float64) - references[o.seed][:n])))
                examples.append({"index": o.index, "seed": o.seed, "served_count": n, "max_abs_diff": diff})
    return {"checked": checked, "mismatched": mismatched, "wrong_seeds": wrong_seeds, "examples": examples}


def streams_vs_references(streams: dict[int, np.ndarray], references: dict[int, np.ndarray]) -> dict:
    """The in-process 64-candidate streams' first candidates against the service's count-8 groups."""
    per_seed = {}
    for seed, ref in references.items():
        if seed in streams:
            first = streams[seed][: ref.shape[0]]
            per_seed[str(seed)] = {"bitwise": same_bits(first, ref),
                                   "max_abs_diff": float(np.max(np.abs(first.astype(np.float64) - ref)))}
    return {"per_seed": per_seed, "all_bitwise": all(v["bitwise"] for v in per_seed.values()) if per_seed else None}
