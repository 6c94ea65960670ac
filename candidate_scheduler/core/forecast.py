"""When will each queued group finish? A fast simulation of the planner over the cost model.

The forecast replays the engine's own planning rule (core/planning.py: `plan_step` or `plan_dispatch`)
in simulated time: workers hold what they run now (each assignment ends at its predicted time), the
queued units are placed in queue order whenever the rule places them, and each placement lasts what
the cost model predicts for it (core/cost_model.py). Events are group starts and ends only -- not
denoise steps -- so a forecast over a queue of Q units costs O(Q^2 x workers) planner checks, a
millisecond or two for the queues deadlines allow.

It answers the deadline questions of core/deadlines.py: can a new group still finish in time, and
how many candidates can a group about to start afford without making a later group late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.planning import Unit, WorkerSlot, plan_dispatch, plan_step


@dataclass(frozen=True)
class Job:
    """A queued unit as the forecast sees it: who, how many candidate rows, how much work."""

    unit: Unit
    rows: int  # candidate rows (what worker capacity counts)
    cost_rows: int  # rows a forward carries (candidates x observations)
    steps: int
    label: str


@dataclass
class SimWorker:
    worker_id: str
    capacity: int
    running: list[tuple[float, int, tuple]] = field(default_factory=list)  # (end, rows, forward key)

    def slot(self) -> WorkerSlot:
        used = sum(r for _e, r, _k in self.running)
        key = self.running[0][2] if self.running else None
        return WorkerSlot(self.worker_id, self.capacity, self.capacity - used, key)


def duration(cost: CostModel, worker: SimWorker, jobs: list[Job], mode: str) -> float:
    """Predicted wall time of jobs placed together on `worker` (one dispatch batch, or one join)."""
    label = jobs[0].label
    rows = sum(j.cost_rows for j in jobs)
    if mode == "dispatch":
        steps = max(j.steps for j in jobs)
        return len(jobs) * cost.group_s(worker.worker_id, label, 0, 0) + steps * cost.forward_s(worker.worker_id, label, rows)
    shared = rows + sum(r for _e, r, _k in worker.running)  # the rows its forwards will carry, now
    return cost.group_s(worker.worker_id, label, rows, jobs[0].steps, batch_rows=shared)


def forecast(now: float, workers: list[SimWorker], jobs: list[Job], cost: CostModel, mode: str) -> dict[str, float]:
    """Predicted finish time of every request id in `jobs` (inf when no worker can ever hold it)."""
    finish: dict[str, float] = {}
    pending = list(jobs)
    by_key = {(j.unit.request_id, j.unit.slice_index): j for j in jobs}
    t = now
    sims = {w.worker_id: w for w in workers}
    for _ in range(4 * len(jobs) + 4):
        if not pending:
            break
        units = [j.unit for j in pending]
        if mode == "dispatch":
            idle = [w.slot() for w in sims.values() if not w.running]
            placed = [(wid, list(batch.entries)) for wid, batch in plan_dispatch(units, idle)]
            groups = [(wid, [by_key[(e.request_id, e.slice_index)] for e in entries]) for wid, entries in placed]
        else:
            groups = [(wid, [by_key[(u.request_id, u.slice_index)]]) for wid, u in plan_step(units, [w.slot() for w in sims.values()])]
        taken = set()
        for wid, js in groups:
            w = sims[wid]
            end = t + duration(cost, w, js, mode)
            w.running.append((end, sum(j.rows for j in js), js[0].unit.forward_key))
            for j in js:
                rid = j.unit.request_id
                finish[rid] = max(finish.get(rid, 0.0), end)
                taken.add((rid, j.unit.slice_index))
        pending = [j for j in pending if (j.unit.request_id, j.unit.slice_index) not in taken]
        if not pending:
            break
        ends = [e for w in sims.values() for e, _r, _k in w.running if e > t]
        if not ends:
            # nothing running and nothing placeable: either every end is now, or no worker can hold them
            if not any(w.running for w in sims.values()):
                break
            t = max(t, min(e for w in sims.values() for e, _r, _k in w.running))
        else:
            t = min(ends)
        for w in sims.values():
            w.running = [x for x in w.running if x[0] > t]
    for j in pending:
        finish[j.unit.request_id] = math.inf
    return finish
