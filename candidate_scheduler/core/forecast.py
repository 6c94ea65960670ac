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

The simulation is event driven -- events are group starts and ends on one worker, never denoise
steps -- and a worker's state is brought up to date only when an event of its own happens or work is
placed on it. It stops as soon as every group asked about has finished, or the simulated time passes
`horizon` (what ends later is reported as inf): a deadline question never simulates past its deadline.

It answers the deadline questions of core/deadlines.py: can a new group still finish in time, and how
many candidates can a group about to start afford without making a later group late.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from candidate_scheduler.core.batch_deadlines import BatchDeadlines
from candidate_scheduler.core.pending import PendingIndex
from candidate_scheduler.core.planning import Unit, WorkerSlot, dispatch_class, plan_dispatch, plan_step, step_class

_DONE = 1e-9  # steps left below this are done


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
    refuses: frozenset[str] = frozenset()  # forward labels it is sent none of (WorkerState.refused_labels)

    def slot(self) -> WorkerSlot:
        used = sum(i.rows for i in self.items)  # may pass its capacity: work it holds waits there (prefetch)
        return WorkerSlot(self.worker_id, self.capacity, max(0, self.capacity - used),
                          self.items[0].key if self.items else None, refuses=self.refuses)

    def stepping(self) -> list[SimItem]:
        return [i for i in self.items if i.delay <= 0.0]

    def step_s(self, cost) -> float:
        """One step of everything stepping here: one forward over all its rows."""
        items = self.stepping()
        if not items:
            return 0.0
        return cost.forward_s(self.worker_id, items[0].label, sum(i.cost_rows for i in items))


def duration(cost, worker_id: str, units: list[Unit] | tuple[Unit, ...], rows_there: int = 0) -> float:
    """Predicted wall time of units placed together on a worker now (one dispatch batch, or one join),
    with the `rows_there` it holds now sharing their forwards (a simulated worker's items, all of them)."""
    label = units[0].label
    rows = sum(u.cost_rows for u in units) + rows_there
    fixed = len(units) * cost.overhead_s(worker_id, label)
    return fixed + max(u.steps for u in units) * cost.forward_s(worker_id, label, rows)


def _key(u: Unit) -> tuple[str, int]:
    return (u.request_id, u.slice_index)


def _place(cost, w: SimWorker, units: tuple[Unit, ...], mode: str) -> None:
    label = units[0].label
    fixed = len(units) * cost.overhead_s(w.worker_id, label)
    delay = 0.0
    if w.conditions_aside:  # the units of one assignment join together, once all are conditioned
        w.preparing = delay = w.preparing + fixed
    else:
        w.stall += fixed
    if mode == "dispatch":  # one batch: its units start and end together
        w.items.append(SimItem(tuple(_key(u) for u in units), sum(u.size for u in units),
                               sum(u.cost_rows for u in units), float(max(u.steps for u in units)), label,
                               units[0].forward_key, delay))
        return
    for u in units:
        w.items.append(SimItem((_key(u),), u.size, u.cost_rows, float(u.steps), label, u.forward_key, delay))


def _next_end(cost, w: SimWorker) -> float:
    """Seconds until the next item on `w` finishes or takes its first step (inf when idle)."""
    stepping = w.stepping()
    ends = [i.delay for i in w.items if i.delay > 0.0]
    if stepping:
        ends.append(w.stall + min(i.steps_left for i in stepping) * w.step_s(cost))
    return min(ends, default=math.inf)


def _advance(cost, w: SimWorker, dt: float) -> list[SimItem]:
    """Move `w` on by dt (never past its next event); returns the items that ended."""
    if not w.items:
        return []
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
    if done:
        w.items = [i for i in w.items if i.steps_left > _DONE]
    return done


def forecast(now: float, workers: list[SimWorker], units: Iterable[Unit], cost, mode: str, *,
             want: Iterable[str] | None = None, orders: dict[str, tuple] | None = None,
             horizon: float = math.inf, deadline_of: Callable[[str], float | None] | None = None) -> dict[str, float]:
    """Predicted finish time of groups: when its last slice ends, counting its slices already running;
    inf when no worker can ever hold one, or when it ends after `horizon`.

    `units` are the queued slices in queue order; they are read lazily, a chunk at a time, as far as the
    simulated workers have rows for them (and past every group asked about). `want`: the request ids to
    answer, with their queue positions in `orders` ((effective deadline, admission order): a group's end
    counts only once the queue has been read past it, so none of its slices is still unread); default:
    every one in `units` and every one running on `workers`, the whole queue read at once. The
    simulation stops once they have all ended. `deadline_of` (the groups' deadlines): dispatch batches are
    filled as the engine fills them, never making a deadline group in one late (core/batch_deadlines.py)."""
    queue = PendingIndex(dispatch_class if mode == "dispatch" else step_class)
    sims = {w.worker_id: w for w in workers}
    chunk = 64 + 2 * sum(w.capacity for w in workers)
    left: dict[str, int] = {}  # slices not ended yet of each group asked about that has shown up
    running = [k for w in workers for i in w.items for k in i.keys]
    orders = dict(orders or {})
    if want is None:
        pending = list(units)
        source = iter(pending)
        chunk = max(chunk, len(pending) + 1)  # read it all at once: every group's slices are known
        wanted = {u.request_id for u in pending} | {k[0] for k in running}
    else:
        source = iter(units)
        wanted = set(want)
    for rid, _slice in running:
        if rid in wanted:
            left[rid] = left.get(rid, 0) + 1
    exhausted = False
    loaded = 0
    read_to: tuple = ()  # the queue position of the last unit read

    def unread(rid: str) -> bool:
        """Some of the group's slices may still be in the part of the queue not read yet."""
        return not exhausted and (rid not in orders or not read_to[:2] > orders[rid])

    def load() -> None:
        nonlocal exhausted, loaded, read_to
        for _ in range(chunk):
            u = next(source, None)
            if u is None:
                exhausted = True
                return
            queue.add(u)
            loaded += 1
            read_to = u.order
            if u.request_id in wanted:
                left[u.request_id] = left.get(u.request_id, 0) + 1
                ended.pop(u.request_id, None)

    ended: dict[str, float] = {}
    clock = dict.fromkeys(sims, now)  # the time each worker's state is at
    events: list[tuple[float, int, str, int]] = []
    version = dict.fromkeys(sims, 0)
    seq = 0

    def reschedule(w: SimWorker) -> None:
        nonlocal seq
        version[w.worker_id] += 1
        dt = _next_end(cost, w)
        if not math.isinf(dt):
            seq += 1
            at = clock[w.worker_id] + dt
            if at <= clock[w.worker_id]:
                # dt is below the clock's resolution (a step of microseconds, a clock of hours): an event at
                # the same instant would move nothing on and come back forever; the next instant moves it on
                # at least as far as it needs
                at = math.nextafter(clock[w.worker_id], math.inf)
            heapq.heappush(events, (at, seq, w.worker_id, version[w.worker_id]))

    def finish(items: list[SimItem], t: float) -> None:
        for item in items:
            for rid, _slice in item.keys:
                if rid in left:
                    left[rid] -= 1
                    if left[rid] == 0:
                        del left[rid]
                        ended[rid] = t

    def batch_deadlines(worker_id: str) -> BatchDeadlines:
        return BatchDeadlines(t, lambda units: duration(cost, worker_id, units), deadline_of, queue)

    def open_groups() -> bool:
        """Some group asked about has slices that have not ended, or may still have some not read."""
        return bool(left) or any(unread(rid) for rid in wanted)

    def plan() -> list[tuple[str, tuple[Unit, ...]]]:
        """The planner's placements now; more of the queue is read when all that is read is placed and
        rows are left, or while a group asked about may still be unread."""
        while True:
            if mode == "dispatch":
                idle = [w.slot() for w in sims.values() if not w.items]
                placed = plan_dispatch(queue, idle, guard=None if deadline_of is None else batch_deadlines)
                room = len(idle) > len(placed)
            else:
                slots = [w.slot() for w in sims.values()]
                placed = [(wid, (u,)) for wid, u in plan_step(queue, slots)]
                room = any(s.free_rows > 0 for s in slots)
            dry = sum(len(units) for _wid, units in placed) == len(queue)
            if exhausted or not ((room and dry) or any(unread(rid) for rid in wanted)):
                return placed
            load()

    for w in sims.values():
        reschedule(w)
    load()
    t = now
    replan = True
    guard = 0
    while open_groups():
        guard += 1
        if guard > 8 * (loaded + len(running)) + 64:
            break  # each pass ends or starts something: never reached, but a broken cost model cannot spin here
        if replan and (len(queue) or not exhausted):
            for wid, group in plan():
                w = sims[wid]
                finish(_advance(cost, w, t - clock[wid]), t)
                clock[wid] = t
                _place(cost, w, group, mode)
                for u in group:
                    queue.discard(u.request_id, u.slice_index)
                reschedule(w)
        replan = False
        while events and events[0][3] != version[events[0][2]]:
            heapq.heappop(events)  # stale: the worker changed since
        if not events or events[0][0] > horizon:
            if not exhausted and any(unread(rid) for rid in wanted):
                load()  # nothing runs now: read on, so that no group asked about is judged unread
                replan = True
                continue
            break  # nothing runs (what is left can never be placed), or the rest ends too late to matter
        t = events[0][0]
        while events and events[0][0] == t:  # every event at this instant before planning again
            _t, _seq, wid, v = heapq.heappop(events)
            if v != version[wid]:
                continue
            w = sims[wid]
            finish(_advance(cost, w, t - clock[wid]), t)
            clock[wid] = t
            reschedule(w)
        replan = True
    return {rid: ended.get(rid, math.inf) for rid in wanted}
