"""The method benchmark's targets (small shape, N=8), each with PASS/MISS; reported, never asserted."""

from __future__ import annotations

from candidate_scheduler.bench.conditioning import cache_targets
from candidate_scheduler.bench.settings import TARGET_N


def targets(result: dict) -> list[dict]:
    """The issue's targets, evaluated on the small shape at N=8 (reported, never asserted)."""
    rows = []
    small = result["shapes"].get("small")
    key = str(TARGET_N)
    if small is not None and key in small["speedup"]:
        sp, ov = small["speedup"][key], small["overhead"][key]
        scaling = small["c_scaling_vs_n1"].get(key)
        rows += [
            {"target": f"(c) at N={TARGET_N} >= 4.5x faster than (a)", "measured": sp["c_vs_a"], "unit": "x",
             "pass": sp["c_vs_a"] is not None and sp["c_vs_a"] >= 4.5},
            {"target": f"(c) at N={TARGET_N} faster than (b)", "measured": sp["c_vs_b"], "unit": "x",
             "pass": sp["c_vs_b"] is not None and sp["c_vs_b"] > 1.0},
            {"target": f"(c) at N={TARGET_N} <= 1.6x its N=1 latency", "measured": scaling, "unit": "x",
             "pass": scaling is not None and scaling <= 1.6},
            {"target": f"(d) over (c) at N={TARGET_N} <= 5%", "measured": None if ov["ratio_d_over_c"] is None
             else (ov["ratio_d_over_c"] - 1.0) * 100, "unit": "%",
             "pass": ov["ratio_d_over_c"] is not None and ov["ratio_d_over_c"] <= 1.05},
            {"target": f"(d) over (c) at N={TARGET_N} < 1 ms median added", "measured": ov["added_ms_median_paired"],
             "unit": "ms", "pass": ov["added_ms_median_paired"] < 1.0},
        ]
        if ov.get("outside_model_added_ms") is not None:
            # the same two targets on the controlled measure (time outside the model work)
            rows += [
                {"target": f"(d) over (c) at N={TARGET_N} <= 5%, controlled: time outside the model",
                 "measured": ov["outside_model_added_pct"], "unit": "%", "pass": ov["outside_model_added_pct"] <= 5.0},
                {"target": f"(d) over (c) at N={TARGET_N} < 1 ms, controlled: time outside the model",
                 "measured": ov["outside_model_added_ms"], "unit": "ms", "pass": ov["outside_model_added_ms"] < 1.0},
            ]
    rows += cache_targets(result)
    null = result.get("null_worker")
    if null:
        rows.append({"target": "null-worker admission >= 2,000 groups/s (1,000 queued, over ZMQ)",
                     "measured": null["admitted_groups_per_s"], "unit": "groups/s",
                     "pass": null["admitted_groups_per_s"] >= 2000})
    return rows


def speedup_ceiling(result: dict) -> dict | None:
    """The most (c) could be faster than (a) at N=8 on this run's machine even if its denoise cost
    nothing: (a)'s median over (c)'s own conditioning median. Both pay one encode of the fresh
    observation ((a) reuses its first call's encode through sglang's cache), and the encode must stay
    sglang's own arithmetic for bitwise parity, so no scheduling change can beat this ratio."""
    small = result["shapes"].get("small")
    key = str(TARGET_N)
    if small is None or key not in small["methods"]["a_sequential"]:
        return None
    a = small["methods"]["a_sequential"][key]["median_ms"]
    cond = small["methods"]["c_worker_batch"][key].get("condition_ms")
    if not a or not cond:
        return None
    return {"a_ms": a, "c_condition_ms": cond, "ceiling_x": a / cond}
