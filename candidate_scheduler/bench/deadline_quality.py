"""The quality proxy of an elastic count: how far the mean of the first n candidates of a seed stream is
from the mean of 64 candidates of the same stream.

The streams run in this process on the Cosmos3 adapter (the worker's own code, one running batch, on a
compute thread as the worker runs it), independently of the scheduler: the table is a property of the
model and the seeds, not of the serving. A stream's candidate i is the same seed whatever the count
(core/rng.py), so candidates 0..7 of a 64-stream are the candidates of a count-8 group of that seed --
the benchmark checks that against the groups the service runs alone.

RMSE(n) = sqrt(mean((mean(c[0:n]) - mean(c[0:64]))^2)) over the action's elements, averaged over seeds;
for independent candidates it falls like sigma * sqrt(1/n - 1/64).
"""

from __future__ import annotations

import numpy as np

from candidate_scheduler.bench.common import PROMPT

REFERENCE_COUNT = 64


def candidate_streams(model: str, seeds: list[int], sampling: dict, image: np.ndarray,
                      count: int = REFERENCE_COUNT, device: str = "cpu") -> tuple[dict[int, np.ndarray], dict]:
    """{seed: float32 [count, horizon, D]} for each base seed (one observation), and run facts."""
    import time

    from candidate_scheduler.bench.inprocess import ComputeThread, quiet_logs, quiet_sglang
    from candidate_scheduler.core import rng
    from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    quiet_logs()
    t0 = time.perf_counter()
    adapter = Cosmos3CandidateAdapter(model, device=device, max_candidates_per_batch=count * len(seeds))
    quiet_sglang()
    load_s = time.perf_counter() - t0
    spec = SamplingSpec(**sampling)
    items = [GroupWork(f"quality-{s}", image[None], [PROMPT], spec,
                       [CandidateWork(i, cs) for i, cs in enumerate(rng.candidate_seeds(s, count, "per_candidate"))])
             for s in seeds]
    compute = ComputeThread()  # torch work from a worker-style thread (see bench/inprocess.py)
    try:
        t1 = time.perf_counter()
        outputs, _report = compute.call(adapter.run_batch, items)
        run_s = time.perf_counter() - t1
    finally:
        compute.close()
    streams = {}
    for s, out in zip(seeds, outputs):
        if out.status != "ok":
            raise RuntimeError(f"quality stream {s}: {out.error_code}: {out.error}")
        streams[s] = np.asarray(out.actions, dtype=np.float32)[:, 0]  # one observation
    return streams, {"load_s": load_s, "run_s": run_s, "rows": count * len(seeds)}


def mean_action(candidates: np.ndarray) -> np.ndarray:
    """The served action of these candidates: the service's own mean reducer."""
    from candidate_scheduler.core import reducers

    return np.asarray(reducers.reduce("mean", candidates), dtype=np.float64)


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2)))


def quality_table(streams: dict[int, np.ndarray], max_n: int) -> dict:
    """RMSE of the n-candidate mean against the 64-candidate mean, per n in 1..max_n."""
    refs = {s: mean_action(c) for s, c in streams.items()}
    per_count = {}
    for n in range(1, max_n + 1):
        per_seed = [rmse(mean_action(c[:n]), refs[s]) for s, c in streams.items()]
        per_count[str(n)] = {"rmse": float(np.mean(per_seed)), "rmse_per_seed": per_seed}
    spread = float(np.mean([np.std(c.astype(np.float64), axis=0).mean() for c in streams.values()]))
    first = per_count["1"]["rmse"]
    for row in per_count.values():
        row["relative_to_n1"] = row["rmse"] / first if first > 0 else None
    return {"reference_count": next(iter(streams.values())).shape[0], "seeds": list(streams),
            "candidate_std": spread, "per_count": per_count}


def delivered(table: dict, served_histogram: dict[str, int]) -> float | None:
    """The table's RMSE weighted by how often each served count was delivered."""
    total = sum(served_histogram.values())
    if not total:
        return None
    return sum(table["per_count"][n]["rmse"] * k for n, k in served_histogram.items()) / total


def reply_rmse(outcomes, streams: dict[int, np.ndarray], deadline_s: float) -> float | None:
    """The RMSE each in-time reply's own action had against its seed's 64-candidate mean (mean over
    replies): the delivered quality measured, not looked up."""
    refs = {s: mean_action(c) for s, c in streams.items()}
    errs = [rmse(o.action, refs[o.seed]) for o in outcomes
            if o.status == "done" and o.latency_s is not None and o.latency_s <= deadline_s
            and o.action is not None and o.seed in refs]
    return float(np.mean(errs)) if errs else None
