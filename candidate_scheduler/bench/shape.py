"""One shape of the method benchmark: warm-up, timed interleaved repeats and a memory pass, then the
per-method aggregates, the speedups and the scheduler's own cost ((d) - (c))."""

from __future__ import annotations

from typing import Any

import numpy as np

from candidate_scheduler.bench.common import ratio, summary_stats
from candidate_scheduler.bench.memory import MemoryProbe
from candidate_scheduler.bench.methods import Bench
from candidate_scheduler.bench.settings import METHODS, SHAPES, SHORT


def run_shape(bench: Bench, mem: MemoryProbe, shape_name: str, ns, repeats: int, progress,
               separate_memory_pass: bool = True) -> dict:
    """Warm-up, timed repeats and a memory pass for one shape. Every group (one repeat of one N) gets a
    fresh observation, shared by the four methods, so sglang's cross-request conditioning cache
    (`runtime/cache/conditioning.py`) cannot replay an earlier group's VAE encode: within (a)'s N
    calls it still hits after the first call, as it would for a real client.

    Memory comes from a separate untimed pass after the repeats (the smoke run measures it during the
    warm-up instead, which includes first-call allocations)."""
    shape = SHAPES[shape_name]
    bench.set_shape(shape)
    samples = {m: {n: [] for n in ns} for m in METHODS}
    runs_meta = {m: {n: [] for n in ns} for m in METHODS}
    parity = {m: {n: 0.0 for n in ns} for m in METHODS}
    memory = {m: {} for m in METHODS}
    image_seed = iter(range(1, 1 << 30))

    def group(phase: str, n: int, order, timed: bool = False, measure_memory: bool = False) -> None:
        bench.set_image(next(image_seed))
        runs = {}
        for method in order:
            progress.set_description(f"{shape_name} {phase} N={n} {SHORT[method]}")
            bench.fresh_conditioning()
            token = None
            if measure_memory:
                token = mem.begin(bench.worker_pid() if method == "d_scheduler_e2e" else None)
            runs[method] = bench.run(method, n)
            if token is not None:
                memory[method][n] = mem.end(token)
            progress.update(1)
        ref = runs["a_sequential"].actions.astype(np.float64)
        for method, r in runs.items():
            if r.actions.shape != ref.shape:
                raise RuntimeError(f"{method} N={n}: actions {r.actions.shape} vs (a) {ref.shape}")
            diff = float(np.max(np.abs(r.actions.astype(np.float64) - ref)))
            parity[method][n] = max(parity[method][n], diff)
            if timed:
                samples[method][n].append(r.latency_s)
                runs_meta[method][n].append(r)

    for n in ns:  # warm-up: every (method, N) once, untimed
        group("warm-up", n, METHODS, measure_memory=not separate_memory_pass)
    # Timed repeats, interleaved: every repeat runs every N and every method, rotating the order.
    for rep in range(repeats):
        for k, n in enumerate(ns):
            shift = (rep + k) % len(METHODS)
            group(f"rep {rep + 1}/{repeats}", n, METHODS[shift:] + METHODS[:shift], timed=True)
    if separate_memory_pass:
        for n in ns:  # memory: one more untimed group per N, with the peak reset before each method
            group("memory", n, METHODS, measure_memory=True)

    out: dict[str, Any] = {"sampling": bench.sampling.to_dict() if hasattr(bench.sampling, "to_dict") else dict(shape),
                           "repeats": repeats, "ns": list(ns), "methods": {}}
    def med(values, scale: float = 1.0):
        values = [v for v in values if v is not None]
        return float(np.median(values)) * scale if values else None

    for method in METHODS:
        per_n = {}
        for n in ns:
            rs = runs_meta[method][n]
            lat = summary_stats(samples[method][n])
            keys = sorted({k for r in rs if r.extra for k, v in r.extra.items() if isinstance(v, (int, float))})
            extra = {k: med([r.extra.get(k) for r in rs if r.extra]) for k in keys}
            if method == "d_scheduler_e2e" and rs:
                # where (d)'s time goes: client <-> scheduler, scheduler <-> worker (incl. the worker's
                # own handling), and the model work the worker reports
                extra["client_scheduler_ms"] = med([r.latency_s - r.extra["scheduler_total_s"] for r in rs
                                                    if r.extra.get("scheduler_total_s") is not None], 1e3)
                extra["scheduler_worker_ms"] = med([r.extra["scheduler_total_s"] - r.extra["model_s"] for r in rs
                                                    if r.extra.get("scheduler_total_s") is not None], 1e3)
                extra["outside_model_ms"] = med([r.latency_s - r.extra["model_s"] for r in rs], 1e3)
                extra.update(path_split(rs, med))
            if method == "c_worker_batch" and rs:
                extra["outside_model_ms"] = med([r.latency_s - r.extra["model_s"] for r in rs], 1e3)
            per_n[str(n)] = {
                "latency_ms": [x * 1e3 for x in samples[method][n]],
                "median_ms": lat["median"] * 1e3,
                "p90_ms": lat["p90"] * 1e3,
                "min_ms": lat["min"] * 1e3,
                "forwards": med([r.forwards for r in rs]),
                "condition_ms": med([r.condition_s for r in rs], 1e3),
                "reducer_us": med([r.reducer_s for r in rs], 1e6),
                "memory": memory[method][n],
                "parity_max_abs_diff_vs_a": parity[method][n],
                "extra": extra or None,
            }
        out["methods"][method] = per_n
    # Speedups (ratio of medians) and the scheduler's own cost ((d) - (c), paired per repeat).
    speedup: dict[str, dict] = {}
    overhead: dict[str, dict] = {}
    for n in ns:
        med_ = {m: out["methods"][m][str(n)]["median_ms"] for m in METHODS}
        speedup[str(n)] = {
            "c_vs_a": ratio(med_["a_sequential"], med_["c_worker_batch"]),
            "c_vs_b": ratio(med_["b_sglang_batch"], med_["c_worker_batch"]),
            "d_vs_a": ratio(med_["a_sequential"], med_["d_scheduler_e2e"]),
            "d_vs_b": ratio(med_["b_sglang_batch"], med_["d_scheduler_e2e"]),
            "b_vs_a": ratio(med_["a_sequential"], med_["b_sglang_batch"]),
        }
        paired = [(d - c) * 1e3 for c, d in zip(samples["c_worker_batch"][n], samples["d_scheduler_e2e"][n])]
        overhead[str(n)] = {
            "c_median_ms": med_["c_worker_batch"],
            "d_median_ms": med_["d_scheduler_e2e"],
            "ratio_d_over_c": ratio(med_["d_scheduler_e2e"], med_["c_worker_batch"]),
            "added_ms_median_paired": float(np.median(paired)),
            "added_ms_diff_of_medians": med_["d_scheduler_e2e"] - med_["c_worker_batch"],
            "c_model_ms": (out["methods"]["c_worker_batch"][str(n)]["extra"] or {}).get("model_s", 0) * 1e3,
            "d_model_ms": (out["methods"]["d_scheduler_e2e"][str(n)]["extra"] or {}).get("model_s", 0) * 1e3,
            "d_client_scheduler_ms": (out["methods"]["d_scheduler_e2e"][str(n)]["extra"] or {}).get("client_scheduler_ms"),
            "d_scheduler_worker_ms": (out["methods"]["d_scheduler_e2e"][str(n)]["extra"] or {}).get("scheduler_worker_ms"),
        }
        c_out = (out["methods"]["c_worker_batch"][str(n)]["extra"] or {}).get("outside_model_ms")
        d_out = (out["methods"]["d_scheduler_e2e"][str(n)]["extra"] or {}).get("outside_model_ms")
        # The controlled view: time outside the model work, (d) minus (c). The raw (d) - (c) above
        # also carries any difference in model speed between the worker process and this one.
        added = None if c_out is None or d_out is None else d_out - c_out
        overhead[str(n)]["outside_model_added_ms"] = added
        overhead[str(n)]["outside_model_added_pct"] = (
            None if added is None or not med_["c_worker_batch"] else added / med_["c_worker_batch"] * 100)
    out["speedup"] = speedup
    out["overhead"] = overhead
    c1 = out["methods"]["c_worker_batch"].get("1")
    out["c_scaling_vs_n1"] = {str(n): ratio(out["methods"]["c_worker_batch"][str(n)]["median_ms"], c1["median_ms"])
                             for n in ns} if c1 else {}
    return out


def path_split(runs, med) -> dict:
    """(d)'s time outside the model, in four consecutive parts (medians, ms), from the reply's clocks:
    the client's two hops and codec (client latency - the shell's receipt-to-reply), the shell and
    engine around the group (receipt-to-reply - the group's engine time), the worker link (engine time
    - the worker's own receipt-to-result: both hops, dispatch and fold) and the worker outside the
    model (its receipt-to-result - the model work it reports)."""
    rs = [r for r in runs if r.extra and None not in (r.extra.get("receipt_to_reply_s"), r.extra.get("worker_s"),
                                                      r.extra.get("scheduler_total_s"))]
    if not rs:
        return {}
    x = [r.extra for r in rs]
    return {
        "path_client_ms": med([r.latency_s - e["receipt_to_reply_s"] for r, e in zip(rs, x)], 1e3),
        "path_scheduler_ms": med([e["receipt_to_reply_s"] - e["scheduler_total_s"] for e in x], 1e3),
        "path_worker_link_ms": med([e["scheduler_total_s"] - e["worker_s"] for e in x], 1e3),
        "path_worker_ms": med([e["worker_s"] - e["model_s"] for e in x], 1e3),
    }
