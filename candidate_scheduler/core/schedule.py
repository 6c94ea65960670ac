"""One planning pass as a value: what to start where, and which elastic counts to fix first.

`plan(snapshot)` reads a planning snapshot (core/snapshot.py) and changes nothing; the engine applies
the `SchedulePlan` it returns (`Engine.apply`), which is where groups, workers and the queue change and
the messages to send are made -- vLLM v1's split of `Scheduler.schedule()` from the `SchedulerOutput`
it returns. A pass either fixes elastic counts (`resizes`) or places work (`placements`), never both:
a count changes a group's slices, so the engine applies the resizes and plans again.

Placements become assignments (one BATCH or JOIN message each). Under dispatch batching a worker gets
one batch, unless its slices together would weigh more than `MAX_ASSIGNMENT_BYTES` (large
observations): then it gets them as consecutive batches, the later ones waiting on it for its rows. Under step batching the slices a pass places on one worker that share a batch key (they
run in lockstep: same schedule, same steps) go out as one assignment when conditioning them all costs
less than one step there -- a joiner then waits at most about a step for the others, the worker gets
one message instead of many, and lockstep slices share their solver steps; otherwise each slice is an
assignment of its own and joins as soon as it is conditioned. Slices that wait on the worker for rows
(prefetch) go after those that start now. Sent at once (no late prefetch), they are bundled so only
when what they wait for is one assignment, else each goes alone, in queue order: the worker admits an
assignment whole once its rows are free, so a bundle waiting behind several would hold its first slice
until the rows of the last are free too (late prefetch sends only rows about to free together).

`Trace` records which group the pass was deciding about, so that when code inside it raises, the
engine fails that group alone (core/engine.py, "atomic events").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from candidate_scheduler.core import deadlines
from candidate_scheduler.core.forecast import duration
from candidate_scheduler.core.planning import Unit, plan_dispatch, plan_step
from candidate_scheduler.core.snapshot import PlanningSnapshot
from candidate_scheduler.core.values import value

ELASTIC_LOOKAHEAD = 4  # waiting groups (dispatch) or slices (step) per worker at the head whose elastic counts
ELASTIC_BUDGET = 8  # each pass reconsiders; at most this many beyond those of the groups it places
ELASTIC_WINDOW = 64  # queued slices read for them at most under dispatch (a group of many slices is one group)
# An assignment message must stay under the worker socket's limit (protocol.MAX_MESSAGE_BYTES, 64 MiB):
# over it, ZMQ closes the worker's connection, which does not come back, and the groups in it are lost
# with the worker. One slice fits alone (an observation is at most 32 MiB); more go together up to this.
MAX_ASSIGNMENT_BYTES = 48 * 2**20


@value
class Placement:
    """One assignment: these units to this worker, joining its running batch when `join`."""

    worker_id: str
    units: tuple[Unit, ...]
    join: bool
    predicted_s: float  # the cost model's prediction of its wall time (0.0 while uncalibrated)
    run_s: float = 0.0  # of predicted_s, the time it takes once it starts (less its wait on the worker)

    @property
    def rows(self) -> int:
        return sum(u.size for u in self.units)


@value
class Resize:
    """Serve the first `count` candidates of an elastic group that has not started."""

    request_id: str
    count: int


@value
class SchedulePlan:
    resizes: tuple[Resize, ...] = ()
    placements: tuple[Placement, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.resizes or self.placements)


@dataclass
class Trace:
    """The group a pass is deciding about right now (None between decisions)."""

    request_id: str | None = None

    def at(self, request_id: str | None) -> None:
        self.request_id = request_id


def plan(snap: PlanningSnapshot, *, elastic: bool = True, trace: Trace | None = None) -> SchedulePlan:
    trace = trace if trace is not None else Trace()
    if not snap.workers or not len(snap.queue) or not snap.room_now():
        return SchedulePlan()
    placed = _place(snap, trace)
    trace.at(None)  # what follows is about no group until it names one
    if elastic and snap.elastic:
        resizes = _resizes(snap, placed, trace)
        if resizes:
            return SchedulePlan(resizes=resizes)
    return SchedulePlan(placements=_assignments(snap, placed, trace))


def _place(snap: PlanningSnapshot, trace: Trace) -> list[tuple[str, tuple[Unit, ...]]]:
    if snap.batching == "dispatch":
        idle = [w.batch_slot() for w in snap.due_now()]
        return plan_dispatch(snap.queue, idle, trace.at, deadlines.batch_guard(snap)) if idle else []
    slots = [w.slot(spare=spare) for w, spare in snap.rows_due()]
    if not slots:
        return []  # the common case under load: every row busy, nothing to plan
    return [(wid, (u,)) for wid, u in plan_step(snap.queue, slots, deadlines.backfiller(snap), trace.at)]


def _resizes(snap: PlanningSnapshot, placed, trace: Trace) -> tuple[Resize, ...]:
    """Elastic counts: fix the count of the groups about to start -- those placed now, and the first
    few waiting at the head, which may start now with fewer candidates rather than later with all."""
    must = dict.fromkeys(u.request_id for _wid, units in placed for u in units)
    head: dict[str, None] = {}
    # Under dispatch batching the look-ahead counts groups, not slices. A batch forms in this pass: a group
    # not shrunk now misses it for a whole batch, and the admission forecast packed every queued elastic
    # group at its minimum (core/deadlines.py). Counted in slices, a group of four 2-row slices starting at
    # its minimum hid the next elastic group, which kept its full count, did not fit the row left and ran a
    # batch later, alone: a group admitted behind both expired. Under step batching a group shrunk a pass
    # later still joins at the next step boundary; there, reaching further fixed counts sooner and refused
    # more newcomers than it saved from expiring (8 seeds of test_deadline_policy's 1.5x load: 23 more
    # refused, 17 fewer late, 6 fewer in time), so the slices still count.
    if snap.batching == "dispatch":
        wanted, window = min(ELASTIC_BUDGET, ELASTIC_LOOKAHEAD * len(snap.workers)), ELASTIC_WINDOW
    else:
        wanted, window = ELASTIC_BUDGET, ELASTIC_LOOKAHEAD * len(snap.workers)
    for walked, unit in enumerate(snap.queue.ordered()):
        if walked >= window or len(head) >= wanted:
            break
        if unit.request_id not in must:
            head[unit.request_id] = None
    resizes = []
    for rid in (*must, *head):
        trace.at(rid)
        view = snap.group(rid)
        if view is None or not view.elastic:
            continue
        n = deadlines.choose_count(snap, view)
        if n < view.served_count:
            resizes.append(Resize(rid, n))
    trace.at(None)
    return tuple(resizes)


def _assignments(snap: PlanningSnapshot, placed, trace: Trace) -> tuple[Placement, ...]:
    by_worker: dict[str, list[tuple[Unit, ...]]] = {}
    for wid, units in placed:
        by_worker.setdefault(wid, []).append(units)
    out = []
    for wid, groups in by_worker.items():
        trace.at(None)
        view = snap.worker(wid)
        # every row it holds shares the forwards of what joins now (a sim's items: sim_workers)
        there = sum(a.cost_rows for a in view.running) if snap.calibrated else None
        busy = bool(view.running)
        free = view.free_rows if snap.batching == "step" else (0 if busy else view.rows)
        until = view.busy_until  # when what it holds is predicted done, this pass's placements included
        for units in _by_weight(_together(snap, view, groups)):
            trace.at(units[0].request_id)
            rows = sum(u.size for u in units)
            predicted = run = 0.0
            if there is not None and rows <= free:
                predicted = run = duration(snap.cost, wid, units, there)
                until = max(until, snap.now + predicted)
                there += sum(u.cost_rows for u in units)  # what follows in this pass shares its forwards
            elif there is not None:  # it waits on the worker until what it holds now is done, then runs
                wait, alone = max(0.0, until - snap.now), duration(snap.cost, wid, units)
                if view.conditions_aside:  # conditioned on the worker's side thread while it waits: it starts
                    # once both are done (counted in full, each held batch's predicted end would drift
                    # later than the real one by its conditioning, and late prefetch would send the next late)
                    fixed = len(units) * snap.cost.overhead_s(wid, units[0].label)
                    run = alone - fixed
                    predicted = max(wait, fixed) + run
                else:
                    run = alone
                    predicted = wait + alone
            free = free - rows if snap.batching == "step" else 0  # a dispatch worker runs one batch at a time
            out.append(Placement(wid, units, busy and snap.batching == "step", predicted, run))
            busy = True
    trace.at(None)
    return tuple(out)


def _by_weight(assignments: list[tuple[Unit, ...]]) -> list[tuple[Unit, ...]]:
    """Each assignment cut, in order, into parts of at most MAX_ASSIGNMENT_BYTES (a slice heavier than
    that alone goes alone): one message each."""
    out: list[tuple[Unit, ...]] = []
    for units in assignments:
        if len(units) == 1 or sum(u.wire_bytes for u in units) <= MAX_ASSIGNMENT_BYTES:
            out.append(units)  # nearly always
            continue
        part: list[Unit] = []
        weight = 0
        for u in units:
            if part and weight + u.wire_bytes > MAX_ASSIGNMENT_BYTES:
                out.append(tuple(part))
                part, weight = [], 0
            part.append(u)
            weight += u.wire_bytes
        out.append(tuple(part))
    return out


def _together(snap: PlanningSnapshot, view, groups: list[tuple[Unit, ...]]) -> list[tuple[Unit, ...]]:
    """The assignments of one worker's placements (see the module docstring): never more rows than it
    runs at once, and what starts now apart from what waits on the worker for rows (prefetch)."""
    if snap.batching == "dispatch" or len(groups) == 1:
        return groups
    free = view.free_rows
    now: list[Unit] = []
    later: list[Unit] = []
    for units in groups:
        for u in units:
            (now if u.size <= free else later).append(u)
            # a unit that waits holds the free rows too (planning.WorkerSlot.take): the worker admits in
            # arrival order, so a later unit sent first into them would run ahead of it for its whole run
            free -= min(u.size, free)
    # The worker admits what waits whole, in arrival order, once all its rows are free. Bundled, the first
    # unit that waits would wait for the rows of those behind it too, and rows held by several assignments
    # free as each ends, maybe a whole long run apart. A bundle delays none of them behind one assignment
    # (its rows free at once), or under late prefetch, which gives only rows predicted to free within the
    # lead (PlanningSnapshot.spare_due); spare rows given at once are any the worker will free, some late.
    at_once = snap.prefetch_lead_s == math.inf or not snap.calibrated
    out: list[tuple[Unit, ...]] = []
    for part in (now, later):
        if part is later and at_once and len(view.running) + len(out) > 1:
            out.extend((u,) for u in later)
            break
        lockstep: dict[tuple, list[Unit]] = {}
        for u in part:
            lockstep.setdefault(u.batch_key, []).append(u)
        for units in lockstep.values():
            label = units[0].label
            conditioning = len(units) * snap.cost.overhead_s(view.worker_id, label)
            step = snap.cost.forward_s(view.worker_id, label, sum(u.cost_rows for u in units))
            if conditioning > step:
                out.extend((u,) for u in units)
                continue
            chunk: list[Unit] = []
            for u in units:
                if chunk and sum(c.size for c in chunk) + u.size > view.rows:
                    out.append(tuple(chunk))
                    chunk = []
                chunk.append(u)
            out.append(tuple(chunk))
    return out
