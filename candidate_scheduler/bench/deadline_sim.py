"""The deadline policy with a perfect forecast: the real engine (core/engine.py) against a simulated
worker whose every assignment takes exactly the time the engine predicted for it, in simulated time.

What misses here is the policy's doing (refusal at receipt, earliest deadline first, the elastic count
rule), not the cost model's error or the machine's noise: run next to the service's figures, it
separates the two. Simulated: arrivals (`Engine.submit`), results at `sent_at + predicted_s`
(`Engine.worker_result`), a cancelled row leaving after one more step, and `Engine.tick` every
`tick_s`, as the shell calls it. Not simulated: a joined group slowing the forwards of the groups
already running (the engine's forecast ignores that too, so a perfect forecast cannot have it).
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from candidate_scheduler.bench.deadline_engine import engine_with_worker
from candidate_scheduler.core.messages import CancelRows, Reply, SendWork, SliceOutcome, WorkerResult
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.work import SamplingSpec


def simulate(arrivals: list[float], min_count: int, deadline_s: float, step_s: dict[int, float], sampling: dict,
             overhead_s: float = 0.0, count: int = 8, tick_s: float = 0.05) -> list[dict]:
    """One outcome per arrival: {"status", "error_code", "served_count", "latency_s"}."""
    spec = SamplingSpec(**sampling)
    engine = engine_with_worker(step_s, sampling, heartbeat_timeout_s=1e12)
    shape = (1, spec.horizon, spec.raw_action_dim)
    image = np.zeros((spec.height, spec.width, 3), dtype=np.uint8)
    seq = itertools.count()
    events: list = [(t, next(seq), "submit", i) for i, t in enumerate(arrivals)]
    heapq.heapify(events)
    sent: dict[int, SendWork] = {}
    cancelled: dict[int, set] = {}
    done_at: dict[int, float] = {}
    outcomes: list[dict | None] = [None] * len(arrivals)
    step8 = max(step_s.values())

    def handle(out: list, now: float) -> None:
        for m in out:
            if isinstance(m, SendWork):
                sent[m.batch_id] = m
                end = now + engine.assignments[m.batch_id].predicted_s
                done_at[m.batch_id] = end
                heapq.heappush(events, (end, next(seq), "result", m.batch_id))
            elif isinstance(m, CancelRows) and m.batch_id in sent:
                cancelled.setdefault(m.batch_id, set()).update(m.request_ids)
                end = min(done_at[m.batch_id], now + step8)  # it leaves at the next step boundary
                heapq.heappush(events, (end, next(seq), "result", m.batch_id))
            elif isinstance(m, Reply):
                i = int(m.result.request_id)
                outcomes[i] = {"status": m.result.status, "error_code": m.result.error_code,
                               "served_count": m.result.served_count, "latency_s": now - arrivals[i]}

    next_tick = 0.0
    while events:
        t, _, kind, payload = heapq.heappop(events)
        while next_tick <= t:
            handle(engine.tick(next_tick), next_tick)
            next_tick += tick_s
        if kind == "submit":
            sub = Submission(str(payload), image, "pick", {"count": count, "reducer": "mean", "min_count": min_count},
                             payload, dict(sampling), deadline_s=deadline_s)
            handle(engine.submit(("sim", payload), sub, t), t)
        elif payload in sent:
            work = sent.pop(payload)
            gone = cancelled.pop(payload, set())
            outputs = tuple(
                SliceOutcome(sw.dispatch.request_id, "cancelled") if sw.dispatch.request_id in gone else
                SliceOutcome(sw.dispatch.request_id, "ok", sw.dispatch.candidate_ids,
                             np.zeros((len(sw.dispatch.candidate_ids), *shape), dtype=np.float32))
                for sw in work.slices)
            report = {"condition_s": overhead_s, "transformer_forwards": spec.steps}
            handle(engine.worker_result(work.identity, WorkerResult("w1", payload, outputs, report), t), t)
    for _ in range(int(deadline_s / tick_s) + 2):  # expiries of whatever is left
        handle(engine.tick(next_tick), next_tick)
        next_tick += tick_s
    return [o if o is not None else {"status": "no_reply", "error_code": None, "served_count": None,
                                     "latency_s": None} for o in outcomes]


def summarize_sim(outcomes: list[dict], deadline_s: float) -> dict:
    n = len(outcomes)
    in_time = sum(1 for o in outcomes if o["status"] == "done" and o["latency_s"] <= deadline_s + 1e-9)
    refused = sum(1 for o in outcomes if o["error_code"] == "deadline_unmeetable")
    expired = sum(1 for o in outcomes if o["status"] == "expired")
    late = sum(1 for o in outcomes if o["status"] == "done" and o["latency_s"] > deadline_s + 1e-9)
    served = [o["served_count"] for o in outcomes if o["status"] == "done" and o["served_count"] is not None]
    return {"groups": n, "in_time": in_time, "miss_rate": (n - in_time) / n if n else None, "refused": refused,
            "expired": expired, "done_late": late, "other": n - in_time - refused - expired - late,
            "mean_served_count": float(np.mean(served)) if served else None}
