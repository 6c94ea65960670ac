"""One open-loop load point: send groups at precomputed arrival times, never waiting for replies, and
record each group's latency from its scheduled arrival (so a late sender cannot hide queueing).

Early stop (capacity-search probes and points far past an arm's capacity): once enough groups are
over the SLO that the point's p99 must exceed it whatever the rest do, no further groups are sent,
and those sent and not answered yet are cancelled (when the arm takes CANCEL), so that the arm is
idle before the next point without draining a backlog whose verdict is known. The verdict may come
while the last groups drain too. A cancelled group's latency is the time to its `cancelled` reply: a
lower bound, like a lost one's.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.bench.common import forecast_errors


@dataclass
class Planned:
    at_s: float  # arrival offset from the point's start
    count: int
    request: protocol.SubmitRequest


@dataclass
class Outcome:
    planned: Planned
    status: str = "not_sent"  # a reply status, "lost" (no reply within the drain timeout) or "not_sent"
    latency_s: float | None = None  # scheduled arrival -> reply
    send_lag_s: float | None = None
    metrics: dict = field(default_factory=dict)
    candidates: np.ndarray | None = None


@dataclass
class PointRun:
    rate: float
    outcomes: list[Outcome]
    stopped_early: bool
    wall_s: float
    cancelled: int = 0  # groups sent and asked to stop once the verdict was known

    @property
    def sent(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != "not_sent"]


def over_slo_needed(n: int) -> int:
    """The fewest of n latencies over a bound that force their p99 (numpy's linear interpolation)
    over it: the p99 lies at or above sorted[floor(0.99 (n - 1))]."""
    return n - math.floor(0.99 * (n - 1))


async def _run(endpoint: str, rate: float, planned: list[Planned], slo_s: float, early_stop: bool,
               drain_timeout_s: float, on_reply, cancel) -> PointRun:
    from candidate_scheduler.service.async_client import AsyncClient

    loop = asyncio.get_running_loop()
    client = AsyncClient(endpoint, liveness_s=None)  # measured: its own timeouts, no liveness PINGs
    outcomes = [Outcome(p) for p in planned]
    needed = over_slo_needed(len(planned))
    start = loop.time() + 0.05
    wall0 = time.perf_counter()

    async def one(out: Outcome) -> None:
        due = start + out.planned.at_s
        out.send_lag_s = loop.time() - due
        out.status = "pending"
        result = await client.submit_request(out.planned.request)
        out.latency_s = loop.time() - due
        out.status = result.status
        out.metrics = result.metrics
        out.candidates = result.candidates
        on_reply()

    def over_slo(now: float) -> int:
        late = 0
        for o in outcomes:
            if o.latency_s is not None:  # an answer other than `done` is no group served, however fast
                late += o.latency_s > slo_s or o.status != "done"
            elif o.status == "pending":
                late += now - (start + o.planned.at_s) > slo_s
        return late

    tasks = []
    stopped = False
    try:
        for out in outcomes:
            delay = start + out.planned.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if early_stop and over_slo(loop.time()) >= needed:
                stopped = True
                break
            tasks.append(loop.create_task(one(out)))
        cancelled = []
        waiting, deadline = set(tasks), loop.time() + drain_timeout_s
        while waiting and early_stop and cancel is not None and loop.time() < deadline:
            if stopped or over_slo(loop.time()) >= needed:  # the verdict: stop what is still running
                stopped = True
                await asyncio.sleep(0)  # every task made has sent its group (each sends before it first waits)
                asked = [o.planned.request.request_id for o in outcomes if o.status == "pending"]
                try:
                    await loop.run_in_executor(None, cancel, asked)
                    cancelled = asked
                except Exception as exc:  # noqa: BLE001 - not stopped: the groups are waited for, as without cancel
                    print(f"load point: cancel failed ({exc!r}); waiting for the groups sent", file=sys.stderr)
                break
            _done, waiting = await asyncio.wait(waiting, timeout=0.05)
        if waiting:
            _done, pending = await asyncio.wait(waiting, timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()
            now = loop.time()
            for out in outcomes:
                if out.status == "pending":  # counted at the time waited: a lower bound
                    out.status = "lost"
                    out.latency_s = now - (start + out.planned.at_s)
    finally:
        client.close()
    return PointRun(rate, outcomes, stopped, time.perf_counter() - wall0, len(cancelled))


def run_point(endpoint: str, rate: float, planned: list[Planned], slo_s: float, *, early_stop: bool = False,
              drain_timeout_s: float = 300.0, on_reply=lambda: None, cancel=None) -> PointRun:
    """`cancel(request_ids)` (blocking; run off the event loop): asks the arm to stop groups, once an early
    stop's verdict is known. None: they are waited for."""
    return asyncio.run(_run(endpoint, rate, planned, slo_s, early_stop, drain_timeout_s, on_reply, cancel))


def summarise(run: PointRun, slo_s: float) -> dict:
    """A load point's row: latencies over the groups sent (a lost one counts at the time waited for it, a
    cancelled one at its reply: lower bounds), goodput = groups done within the SLO per second of
    arrivals, time to first step and rows per forward from the replies' metrics when they carry them.
    The point is within the SLO only if every group sent was answered `done`: a group refused or failed
    fast has a short latency, but was not served (as an infinite latency, it would put the p99 of the
    point's few dozen groups over any bound)."""
    sent = run.sent
    window_s = len(sent) / run.rate if sent else 0.0
    lat = np.asarray([o.latency_s for o in sent], dtype=np.float64)
    statuses: dict[str, int] = {}
    for o in sent:
        statuses[o.status] = statuses.get(o.status, 0) + 1
    good = sum(1 for o in sent if o.status == "done" and o.latency_s is not None and o.latency_s <= slo_s)
    first = [float(o.metrics["first_step_s"]) for o in sent if o.metrics.get("first_step_s") is not None]
    first_source = "reply first_step_s" if first else None
    if not first:  # before the engine reports it: a dispatched group's first step follows its conditioning
        first = [float(o.metrics["queue_wait_s"]) + float(o.metrics.get("condition_s") or 0.0)
                 for o in sent if o.metrics.get("queue_wait_s") is not None]
        first_source = "reply queue_wait_s + condition_s" if first else None
    rows = [float(o.metrics["rows_per_forward"]) for o in sent if o.metrics.get("rows_per_forward") is not None]
    p99 = float(np.percentile(lat, 99)) if sent else None
    return {
        "offered_groups_per_s": run.rate,
        "groups_planned": len(run.outcomes),
        "groups_sent": len(sent),
        "window_s": window_s,
        "p50_s": float(np.percentile(lat, 50)) if sent else None,
        "p99_s": p99,
        "max_s": float(lat.max()) if sent else None,
        "goodput_groups_per_s": good / window_s if window_s else 0.0,
        "good_groups": good,
        "slo_s": slo_s,
        "p99_within_slo": bool(p99 is not None and p99 <= slo_s and not run.stopped_early
                               and statuses.get("done", 0) == len(sent)),
        "first_step_p50_s": float(np.median(first)) if first else None,
        "first_step_p99_s": float(np.percentile(first, 99)) if first else None,
        "first_step_source": first_source,
        "rows_per_forward": float(np.mean(rows)) if rows else None,
        "rows_per_forward_source": "reply rows_per_forward (mean over groups)" if rows else None,
        "rows_per_forward_reply_mean": float(np.mean(rows)) if rows else None,
        "statuses": statuses,
        "forecast_error": forecast_errors([o.metrics for o in sent]),
        "stopped_early": run.stopped_early,
        "cancelled_at_verdict": run.cancelled,
        "max_send_lag_s": max((o.send_lag_s for o in sent if o.send_lag_s is not None), default=None),
        "wall_s": run.wall_s,
    }
