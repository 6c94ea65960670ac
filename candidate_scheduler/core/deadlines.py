"""Deadlines: the queue's order, refusing what cannot be met, and the elastic candidate count.

Every rule here reads a planning snapshot (core/snapshot.py), never the engine.

Ordering (earliest deadline first, and nobody starves). Every queued group has an *effective
deadline*: its own deadline, or, without one, its receipt time plus `best_effort_s`. The queue is
served in order of effective deadlines (ties by admission). So groups with deadlines go ahead of groups
without, except that a group without a deadline that has waited `best_effort_s` is ahead of every
deadline that ends later than that: its wait is bounded, it is never starved.

Refusal at receipt. A group with a deadline is forecast (core/forecast.py) as if it and every
not-yet-started elastic group in the queue -- ahead of it or behind it -- ran at their minimum counts:
the most room the scheduler could make (the groups ahead shrink to make it: their counts are chosen
with every deadline group behind them watched, below). If even then it would finish after its
deadline, it is refused at once (`rejected`, `deadline_unmeetable`, with the predicted completion),
instead of being served late. A group that could not finish in time even alone on an idle worker is
refused without a simulation. It is refused too when it could finish in time but only by making late a
group admitted before it with a later deadline that it would go ahead of (the next `WATCH_WINDOW` slices
behind it): a group that was forecast in time without it and is forecast late with it. The promise made
first is kept; the newcomer hears at once, instead of the earlier group expiring at its deadline. (Only
where the exact forecast answers: behind a queue the fluid forecast judges, the newcomer's own finish
decides alone.) Running groups are not watched so: under step batching a joiner's rows slow them, but
refusing such joiners cost more groups in time than it saved from expiring (bench/README.md, "Deadlines
of mixed urgency"), each refusal a certain loss against a forecast one.

Batches (dispatch). A batch takes no filler that would make a deadline group in it late, nor one that
lengthens it from behind a deadline group left out of it (`batch_guard`, core/batch_deadlines.py); the
exact forecast fills its simulated batches by that rule too.

Elastic count before start. For a group with a deadline and min_count < count that is about to start,
or waits near the head of the queue, the largest n in [min_count, count] is chosen such that it and
the deadline groups queued right behind it (the next `WATCH_WINDOW` slices, at their minimum counts;
on a large fleet, a sample of those further behind too: core/fluid.feasibility) are forecast to finish
in time, behind the groups queued ahead of it (at their counts as they stand) -- of those behind, the
exact forecast watches only the ones that would finish in time with it at its minimum;
with no such n, min_count. A waiting group may so start now with the rows that are free instead of
later with all it asked for; once chosen, a count only ever shrinks. The served candidates are
0..n-1, bitwise those of the full group. Without a calibrated cost model there is no forecast and
nothing is refused or shrunk. At a shape some live worker has not measured (neither in its warm-up
profile nor since), a forecast would borrow that worker's line at another shape scaled by the tokens,
and a conv net's cost is not linear in them: no promise rests on it, and an elastic group there is
served at its minimum until every live worker has measured the shape (by serving it).

What a forecast costs. It simulates only until the groups it is asked about have finished, never past
the latest of their deadlines, and loads the queue as far as the simulated workers have rows for it.
Where even that would place more than `fluid.EXACT_LIMIT` slices (a long queue ahead, a large fleet),
the question goes to the fluid forecast (core/fluid.py), the fleet as one pipe, whose answer costs
O(workers + buckets) whatever the queue holds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

from candidate_scheduler.core import fluid
from candidate_scheduler.core.batch_deadlines import BatchDeadlines
from candidate_scheduler.core.forecast import duration, forecast
from candidate_scheduler.core.planning import Unit
from candidate_scheduler.core.snapshot import GroupView, PlanningSnapshot

WATCH_WINDOW = 64  # slices behind a group whose deadlines its count must not break


def effective_deadline(deadline: float | None, received_at: float, best_effort_s: float) -> float:
    return deadline if deadline is not None else received_at + best_effort_s


def _forecast_units(snap: PlanningSnapshot, count_of: Callable[[GroupView], int | None],
                    extra: tuple[GroupView, int] | None = None) -> Iterator[Unit]:
    """The queue in order, as a forecast should see it: a group for which `count_of` gives a count as if
    re-sliced to serve that many, the others as they stand; `extra` (a group not queued yet) at its place."""
    capacity = snap.slice_capacity
    seen: dict[str, bool] = {}  # request id -> its units were replaced
    pending_extra = list(extra[0].units(extra[1], capacity)) if extra is not None else []
    for unit in snap.queue.ordered():
        while pending_extra and pending_extra[0].order < unit.order:
            yield pending_extra.pop(0)
        rid = unit.request_id
        if rid not in seen:
            view = snap.group(rid)
            count = None if view is None else count_of(view)
            seen[rid] = count is not None
            if count is not None:
                yield from view.units(count, capacity)
        if not seen[rid]:
            yield unit
    yield from pending_extra


def _alone_s(snap: PlanningSnapshot, units: list[Unit]) -> float:
    """The least time the largest of these slices takes on any idle worker: a bound no queue improves."""
    return fluid.Pipe.of(snap).run_s(max(units, key=lambda u: u.cost_rows), busy=False)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a deadline group is refused at receipt: its predicted completion (inf: not before its deadline),
    and how many groups admitted before it it would make late (0: its own deadline is what cannot be met)."""

    predicted: float
    harmed: int = 0


def refuse_at_receipt(snap: PlanningSnapshot, view: GroupView) -> Refusal | None:
    """A Refusal when the group's deadline cannot be met even at its minimum, or only by making a group
    admitted before it late (the module docstring); else None."""
    if view.deadline is None or not snap.workers or not snap.calibrated:
        return None
    own = view.units(view.min_count, snap.slice_capacity)
    alone = snap.now + _alone_s(snap, own)
    if alone > view.deadline:
        return Refusal(alone)
    if not fluid.exact_enough(snap, view.order):
        finish = fluid.refusal_finish(snap, view, own)
        return Refusal(finish) if finish > view.deadline else None
    at_minimum = lambda g: g.min_count if g.elastic else None  # noqa: E731 - the most room the queue can make
    others = _promised(snap, view)
    want = {view.request_id: view.order, **{g.request_id: g.order for g in others}}
    horizon = max([view.deadline, *(g.deadline for g in others)])
    finish = forecast(snap.now, snap.sim_workers(), _forecast_units(snap, at_minimum, (view, view.min_count)),
                      snap.planned_cost, snap.batching, want=tuple(want), orders=want, horizon=horizon,
                      deadline_of=snap.deadline_of)
    if finish[view.request_id] > view.deadline:
        return Refusal(finish[view.request_id])
    late = [g for g in others if finish[g.request_id] > g.deadline]
    if not late:
        return None
    # late with it; were they in time without it? (one late anyway is no reason to refuse it)
    before = forecast(snap.now, snap.sim_workers(), _forecast_units(snap, at_minimum), snap.planned_cost,
                      snap.batching, want=tuple(g.request_id for g in late),
                      orders={g.request_id: g.order for g in late}, horizon=max(g.deadline for g in late),
                      deadline_of=snap.deadline_of)
    harmed = sum(before[g.request_id] <= g.deadline for g in late)
    return Refusal(finish[view.request_id], harmed) if harmed else None


def _promised(snap: PlanningSnapshot, view: GroupView) -> list[GroupView]:
    """The deadline groups admitted before `view` that it would go ahead of: those queued behind it (the
    next WATCH_WINDOW slices)."""
    found: dict[str, GroupView] = {}
    for walked, unit in enumerate(snap.queue.ordered((*view.order, math.inf))):
        if walked >= WATCH_WINDOW:
            break
        if unit.request_id not in found and snap.deadline_of(unit.request_id) is not None:
            found[unit.request_id] = snap.group(unit.request_id)
    return [g for g in found.values() if g is not None and g.request_id != view.request_id]


def choose_count(snap: PlanningSnapshot, view: GroupView) -> int:
    """Candidates to serve for a group that has not started (see the module docstring); a binary
    search (`_largest`)."""
    if not view.elastic or not snap.workers or not snap.calibrated:
        return view.served_count
    if not all(snap.cost.knows(w.worker_id, view.label) for w in snap.workers):
        return view.min_count
    # The deadline groups right behind it are watched, at their minimum counts; the groups ahead are
    # forecast too (at their counts as they stand): a group second in the queue that was forecast alone
    # would keep a count it cannot have once the first one starts.
    if not fluid.exact_enough(snap, view.order):
        return _largest(view, fluid.feasibility(snap, view, WATCH_WINDOW))
    behind: dict[str, GroupView] = {}
    for walked, unit in enumerate(snap.queue.ordered((*view.order, math.inf))):
        if walked >= WATCH_WINDOW:
            break
        if unit.request_id not in behind and (g := snap.group(unit.request_id)) is not None:
            behind[unit.request_id] = g
    others = [g for g in behind.values() if g.deadline is not None]

    def count_of(n: int) -> Callable[[GroupView], int | None]:
        return lambda g: n if g.request_id == view.request_id else (
            g.min_count if g.request_id in behind and g.elastic else None)

    def finishes(n: int, groups: list[GroupView]) -> dict[str, float]:
        horizon = max(g.deadline for g in groups)
        return forecast(snap.now, snap.sim_workers(), _forecast_units(snap, count_of(n)), snap.planned_cost,
                        snap.batching, want=[g.request_id for g in groups],
                        orders={g.request_id: g.order for g in groups}, horizon=horizon, deadline_of=snap.deadline_of)

    # Watched too: the running groups ahead of it (its rows slow their forwards). Of those behind it and
    # those, only the ones that can still make their deadlines, with it at its minimum: one already late
    # whatever happens constrains nothing (a group behind that will expire anyway kept every count ahead
    # of it at its minimum, for nothing).
    running = {k[0] for w in snap.workers for a in w.running for k in a.keys}
    others += [g for rid in running if (g := snap.group(rid)) is not None and g.deadline is not None
               and g.running and g.order < view.order]
    watched = [view]
    if others:
        floor = finishes(view.min_count, others)
        watched += [g for g in others if floor[g.request_id] <= g.deadline]

    def feasible(n: int) -> bool:
        finish = finishes(n, watched)
        return all(finish[g.request_id] <= g.deadline for g in watched)

    return _largest(view, feasible)


def _largest(view: GroupView, feasible: Callable[[int], bool]) -> int:
    """The largest n in [min_count, served_count] that is feasible, else min_count, by a binary search.
    A smaller count almost never finishes later; where one does (9 candidates as slices of 5 and 4 on two
    idle workers end before 8 in one slice on one), the search may settle below the largest feasible n:
    what it returns is feasible (or min_count), not always the most."""
    lo, hi = view.min_count, view.served_count
    if feasible(hi):
        return hi
    while lo < hi - 1:  # invariant: hi is infeasible; lo is the fallback (feasible, or the floor)
        mid = (lo + hi) // 2
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return lo


def served_spec(spec, n: int):
    """The spec of the first n candidates of a group (its seeds are the full group's first n)."""
    seeds = None if spec.seeds is None else spec.seeds[:n]
    return dataclasses.replace(spec, count=n, min_count=min(spec.min_count, n), seeds=seeds)


def backfiller(snap: PlanningSnapshot) -> Callable[[str, Unit, Unit], bool] | None:
    """The planner's backfill test (core/planning.py rule 4): may `unit` join `worker_id`, which is kept
    for the blocked `head`? Yes when the unit is forecast to be done before the worker would have freed
    enough rows for the head anyway. None (no backfill) while the cost model is not calibrated."""
    if not snap.workers or not snap.calibrated:
        return None
    cost = snap.planned_cost
    shadows: dict[tuple[str, int], float] = {}

    def shadow(worker_id: str, rows_needed: int) -> float:
        """When the rows running there now will have left enough room for `rows_needed`."""
        key = (worker_id, rows_needed)
        if key not in shadows:
            sim = snap.sim_workers(only=worker_id)[0]
            free = sim.capacity - sum(i.rows for i in sim.items)
            # Each item under a name of its own: the forecast answers per group, and two slices of one group
            # that joined apart end apart -- the first one's rows are free when it ends, not with the last
            items = list(sim.items)
            for n, item in enumerate(items):
                item.keys = ((str(n), 0),)
            ends = forecast(snap.now, [sim], [], cost, snap.batching)  # runs `sim` down to empty
            at = snap.now
            for n in sorted(range(len(items)), key=lambda n: ends.get(str(n), math.inf)):
                if free >= rows_needed:
                    break
                free += items[n].rows
                at = ends.get(str(n), math.inf)
            shadows[key] = at if free >= rows_needed else math.inf
        return shadows[key]

    def ok(worker_id: str, head: Unit, unit: Unit) -> bool:
        there = sum(a.cost_rows for a in snap.worker(worker_id).running)
        return snap.now + duration(cost, worker_id, (unit,), there) <= shadow(worker_id, head.size)

    return ok


def batch_guard(snap: PlanningSnapshot) -> Callable[[str], BatchDeadlines] | None:
    """The dispatch planner's test for each batch it fills (core/batch_deadlines.py): no unit joins a batch
    that it would make a deadline group in it or queued ahead of it miss. None (no test) while the cost model is
    not calibrated, or no live group has a deadline."""
    if not snap.calibrated or not snap.any_deadline:
        return None
    cost = snap.planned_cost

    def guard(worker_id: str) -> BatchDeadlines:
        # a busy worker's next batch (prefetch) starts when its current one is predicted to end
        start = max(snap.now, snap.worker(worker_id).busy_until)
        return BatchDeadlines(start, lambda units: duration(cost, worker_id, units), snap.deadline_of, snap.queue)

    return guard
