"""What one window of open-loop groups under deadlines came to: misses by kind, goodput, served
counts, latencies, and the refusal round trip.

A group counts as *in time* only when it was answered `done` and the client had the reply within the
group's deadline (the robot's view: a reply that left the scheduler in time but arrived late is still
late). Every other group is a miss, of one kind:

- refused: answered `rejected` / `deadline_unmeetable` at receipt;
- expired: admitted, then answered `expired` when its deadline passed;
- done_late: answered `done` after the deadline;
- other: anything else (an error, `overloaded`, no reply at all) -- a benchmark bug or a service fault.
"""

from __future__ import annotations

import numpy as np

from candidate_scheduler.bench.open_loop import Outcome

MISS_KINDS = ("refused", "expired", "done_late", "other")


def kind(o: Outcome, deadline_s: float) -> str:
    if o.status == "done":
        return "in_time" if o.latency_s is not None and o.latency_s <= deadline_s else "done_late"
    if o.status == "rejected" and o.error_code == "deadline_unmeetable":
        return "refused"
    if o.status == "expired":
        return "expired"
    return "other"


def _pct(values, q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def latency_stats_ms(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": _ms(_pct(values, 50)), "p99_ms": _ms(_pct(values, 99)),
            "max_ms": _ms(max(values)) if values else None}


def summarize(outcomes: list[Outcome], deadline_s: float, window_s: float) -> dict:
    """The per-(arm, load) figures of the report."""
    n = len(outcomes)
    kinds = [kind(o, deadline_s) for o in outcomes]
    counts = {k: kinds.count(k) for k in ("in_time", *MISS_KINDS)}
    done = [o for o in outcomes if o.status == "done"]
    served = [o.served_count for o in done if o.served_count is not None]
    refused = [o for o, k in zip(outcomes, kinds) if k == "refused"]
    other = sorted({f"{o.status}:{o.error_code}" for o, k in zip(outcomes, kinds) if k == "other"})
    # the scheduler's own view of a done group: receipt -> reply built (reply metrics total_s)
    sched_done = [float(o.metrics["total_s"]) for o in done if "total_s" in o.metrics]
    sched_refused = [float(o.metrics["receipt_to_reply_s"]) for o in refused if "receipt_to_reply_s" in o.metrics]
    lags = [o.lag_s for o in outcomes]
    return {
        "groups": n,
        "window_s": window_s,
        "achieved_rate": n / window_s if window_s > 0 else None,
        **{k: counts[k] for k in ("in_time", *MISS_KINDS)},
        "misses": n - counts["in_time"],
        "miss_rate": (n - counts["in_time"]) / n if n else None,
        "refused_rate": counts["refused"] / n if n else None,
        "expired_rate": counts["expired"] / n if n else None,
        "done_late_rate": counts["done_late"] / n if n else None,
        "other_statuses": other,
        "goodput": counts["in_time"] / window_s if window_s > 0 else None,
        "mean_served_count": float(np.mean(served)) if served else None,
        "served_count_histogram": {str(k): served.count(k) for k in sorted(set(served))},
        "done_latency": latency_stats_ms([o.latency_s for o in done]),
        "done_scheduler_total": latency_stats_ms(sched_done),
        "scheduler_done_late": sum(1 for t in sched_done if t > deadline_s),
        "refusal_latency": latency_stats_ms([o.latency_s for o in refused]),
        "refusal_scheduler_total": latency_stats_ms(sched_refused),
        "send_lag": latency_stats_ms(lags),
    }


def pooled_refusals(outcomes: list[Outcome]) -> dict:
    """Refusal round trips pooled over many windows (the refusal target is about all of them)."""
    refused = [o for o in outcomes if o.status == "rejected" and o.error_code == "deadline_unmeetable"]
    stats = latency_stats_ms([o.latency_s for o in refused])
    # the scheduler's own receipt -> reply, stamped by its shell around the engine
    stats["scheduler"] = latency_stats_ms([float(o.metrics["receipt_to_reply_s"]) for o in refused
                                           if "receipt_to_reply_s" in o.metrics])
    return stats
