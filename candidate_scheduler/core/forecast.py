"""When will each queued group finish? A fast simulation of the planner over the cost model.

The forecast replays the engine's own planning rule (core/planning.py: `plan_step` or `plan_dispatch`)
in simulated time, over a fluid model of a worker's running batch: every group on a worker advances one
denoise step per step of the worker, and a step takes the forward time of ALL the rows running there
now (core/cost_model.py) -- so a group that joins slows every group already running, as it does on the
worker. A group's fixed cost (conditioning, postprocess) stalls the worker's steps when it joins, as the
worker's compute thread does -- unless the worker conditions joiners on their own thread
(worker/preparing.py, `SimWorker.conditions_aside`): then the joiner waits out its fixed cost (behind the
joiners queued on that thread before it) while the groups already running step on. Queued units are placed
in queue order whenever the rule places them.

Events are group starts and ends only -- not denoise steps -- so a forecast over a queue of Q units
costs O(Q^2 x workers) planner checks: about a millisecond for the queues deadlines allow.

It answers the deadline questions of core/deadlines.py: can a new group still finish in time, and how
many candidates can a group about to start afford without making a later group late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.planning import Unit, WorkerSlot, plan_dispatch, plan_step

_DONE = 1e-9  # steps left below this are done


@dataclass(frozen=True)
class Job:
    """A queued unit as the forecast sees it: who, how many candidate rows, how much work."""

    unit: Unit
    rows: int  # candidate rows (what worker capacity counts)
    cost_rows: int  # rows a forward carries (candidates x observations)
    steps: int
    label: str


@dataclass
class SimItem:
    """Work running on a simulated worker: a join (step batching) or a whole batch (dispatch)."""

    keys: tuple[tuple[str, int], ...]  # (request id, slice index) of what it runs
    rows: int
    cost_rows: int
    steps_left: float
    label: str
    key: tuple
    delay: float = 0.0  # seconds before its first step (its conditioning, on a worker that conditions aside)


@dataclass
class SimWorker:
    worker_id: str
    capacity: int
    items: list[SimItem] = field(default_factory=list)
    stall: float = 0.0  # fixed work (conditioning of groups that joined) before its next step
    conditions_aside: bool = False  # joiners are conditioned on their own thread; nothing stalls
    preparing: float = 0.0  # seconds of conditioning queued on that thread

    def slot(self) -> WorkerSlot:
        used = sum(i.rows for i in self.items)
        return WorkerSlot(self.worker_id, self.capacity, self.capacity - used, self.items[0].key if self.items else None)

    def stepping(self) -> list[SimItem]:
        return [i for i in self.items if i.delay <= 0.0]

    def step_s(self, cost: CostModel) -> float:
        """One step of everything stepping here: one forward over all its rows."""
        items = self.stepping()
        if not items:
            return 0.0
        return cost.forward_s(self.worker_id, items[0].label, sum(i.cost_rows for i in items))


def duration(cost: CostModel, worker: SimWorker, jobs: list[Job]) -> float:
    """Predicted wall time of jobs placed together on `worker` now (one dispatch batch, or one join),
    with the rows running there now sharing its forwards."""
    label = jobs[0].label
    rows = sum(j.cost_rows for j in jobs) + sum(i.cost_rows for i in worker.items)
    fixed = len(jobs) * cost.overhead_s(worker.worker_id, label)
    return fixed + max(j.steps for j in jobs) * cost.forward_s(worker.worker_id, label, rows)


def _place(cost: CostModel, w: SimWorker, jobs: list[Job], mode: str) -> None:
    label = jobs[0].label
    fixed = len(jobs) * cost.overhead_s(w.worker_id, label)
    delay = 0.0
    if w.conditions_aside:  # the jobs of one assignment join together, once all are conditioned
        w.preparing = delay = w.preparing + fixed
    else:
        w.stall += fixed
    if mode == "dispatch":  # one batch: its jobs start and end together
        w.items.append(SimItem(tuple(_key(j) for j in jobs), sum(j.rows for j in jobs),
                               sum(j.cost_rows for j in jobs), float(max(j.steps for j in jobs)), label,
                               jobs[0].unit.forward_key, delay))
        return
    for j in jobs:
        w.items.append(SimItem((_key(j),), j.rows, j.cost_rows, float(j.steps), label, j.unit.forward_key, delay))


def _next_end(cost: CostModel, w: SimWorker) -> float:
    """Seconds until the next item on `w` finishes or takes its first step (inf when idle)."""
    stepping = w.stepping()
    ends = [i.delay for i in w.items if i.delay > 0.0]
    if stepping:
        ends.append(w.stall + min(i.steps_left for i in stepping) * w.step_s(cost))
    return min(ends, default=math.inf)


def _key(j: Job) -> tuple[str, int]:
    return (j.unit.request_id, j.unit.slice_index)


def _advance(cost: CostModel, w: SimWorker, dt: float, t_end: float, ended: dict[tuple[str, int], float]) -> None:
    if not w.items:
        return
    stalled = min(w.stall, dt)
    w.stall -= stalled
    w.preparing = max(0.0, w.preparing - dt)
    tau = w.step_s(cost)
    progress = (dt - stalled) / tau if tau > 0 else math.inf
    for i in w.stepping():
        i.steps_left -= progress
    for i in w.items:  # dt never passes the next first step, so a waiting item starts exactly at a boundary
        if i.delay > 0.0:
            i.delay = 0.0 if i.delay - dt <= _DONE else i.delay - dt
    done = [i for i in w.items if i.steps_left <= _DONE]
    for i in done:
        for key in i.keys:
            ended[key] = t_end
    w.items = [i for i in w.items if i.steps_left > _DONE]


def forecast(now: float, workers: list[SimWorker], jobs: list[Job], cost: CostModel, mode: str) -> dict[str, float]:
    """Predicted finish time of every request id in `jobs` and of every group running on `workers`: when
    its last slice ends, counting its slices already running (inf when no worker can ever hold one)."""
    ended: dict[tuple[str, int], float] = {}
    pending = list(jobs)
    by_key = {_key(j): j for j in jobs}
    sims = {w.worker_id: w for w in workers}
    wanted = set(by_key) | {k for w in workers for i in w.items for k in i.keys}  # running groups too
    t = now
    for _ in range(4 * (len(jobs) + sum(len(w.items) for w in workers)) + 4):
        if pending:
            units = [j.unit for j in pending]
            if mode == "dispatch":
                idle = [w.slot() for w in sims.values() if not w.items]
                groups = [(wid, [by_key[(e.request_id, e.slice_index)] for e in batch.entries])
                          for wid, batch in plan_dispatch(units, idle)]
            else:
                groups = [(wid, [by_key[(u.request_id, u.slice_index)]])
                          for wid, u in plan_step(units, [w.slot() for w in sims.values()])]
            taken = set()
            for wid, js in groups:
                _place(cost, sims[wid], js, mode)
                taken.update(_key(j) for j in js)
            pending = [j for j in pending if _key(j) not in taken]
        if not pending and wanted <= set(ended):
            break
        dt = min((_next_end(cost, w) for w in sims.values()), default=math.inf)
        if math.isinf(dt):
            break  # nothing runs, and what is left can never be placed
        for w in sims.values():
            _advance(cost, w, dt, t + dt, ended)
        t += dt
    finish: dict[str, float] = {}
    for key in wanted:
        finish[key[0]] = max(finish.get(key[0], 0.0), ended.get(key, math.inf))
    return finish
