"""Deadlines: the queue's order, refusing what cannot be met, and the elastic candidate count.

Ordering (earliest deadline first, and nobody starves). Every queued group has an *effective
deadline*: its own deadline, or, without one, its receipt time plus `best_effort_s`. The queue is
served in order of effective deadlines (ties by receipt). So groups with deadlines go ahead of groups
without, except that a group without a deadline that has waited `best_effort_s` is ahead of every
deadline that ends later than that: its wait is bounded, it is never starved.

Refusal at receipt. A group with a deadline is forecast (core/forecast.py) as if it and every
not-yet-started elastic group in the queue -- ahead of it or behind it -- ran at their minimum counts:
the most room the scheduler could make (the groups ahead shrink to make it: their counts are chosen
with every deadline group behind them watched, below). If even then it would finish after its
deadline, it is refused at once (`rejected`, `deadline_unmeetable`, with the predicted completion),
instead of being served late.

Elastic count before start. For a group with a deadline and min_count < count that is about to start,
or waits near the head of the queue, the largest n in [min_count, count] is chosen such that it and
every deadline group queued behind it (at their minimum counts) are forecast to finish in time, behind
the groups queued ahead of it (at their counts as they stand); with no such n, min_count. A waiting
group may so start now with the rows that are free instead of later with all it asked for; once
chosen, a count only ever shrinks. The served candidates
are 0..n-1, bitwise those of the full group. Without a calibrated cost model there is no forecast and
nothing is refused or shrunk.
"""

from __future__ import annotations

import dataclasses
import math

from candidate_scheduler.core.admission import split_balanced
from candidate_scheduler.core.forecast import Job, SimItem, SimWorker, duration, forecast
from candidate_scheduler.core.group_state import GroupStatus
from candidate_scheduler.core.planning import Unit


def effective_deadline(group, best_effort_s: float) -> float:
    return group.deadline if group.deadline is not None else group.received_at + best_effort_s


def order(groups, best_effort_s: float) -> list:
    """Groups in the order the planner serves them (stable: ties keep receipt order)."""
    return sorted(groups, key=lambda g: effective_deadline(g, best_effort_s))


def _jobs(group, capacity: int, count: int | None = None) -> list[Job]:
    """A group's pending work; with `count`, as if it were re-sliced to serve that many candidates."""
    s = group.sampling
    obs = group.request.observations
    fkey, bkey, label = s.forward_key(), s.batch_key(), s.forward_label()
    if count is None:
        pending = group.pending_slices()
    else:
        pending = tuple(enumerate(split_balanced(count, capacity)))
    return [Job(Unit(group.request_id, i, ids, bkey, fkey), len(ids), len(ids) * obs, s.steps, label)
            for i, ids in pending]


def jobs_of(group, entry) -> list[Job]:
    """The job of one slice about to be sent (for the prediction kept with its assignment)."""
    s = group.sampling
    return [Job(Unit(group.request_id, entry.slice_index, entry.candidate_ids, s.batch_key(), s.forward_key()),
                len(entry.candidate_ids), len(entry.candidate_ids) * group.request.observations, s.steps,
                s.forward_label())]


def _startable_min(group) -> int | None:
    """The minimum count of a group that may still shrink (elastic, nothing started), else None."""
    if group.spec.min_count < group.served_count and not any(group.slice_attempts(i) for i in range(len(group.slices))):
        return group.spec.min_count
    return None


def sim_workers(engine, now: float, only: str | None = None) -> list[SimWorker]:
    sims = []
    for w in engine.workers.values():
        if only is not None and w.worker_id != only:
            continue
        sim = SimWorker(w.worker_id, engine.rows_of(w), conditions_aside=w.conditions_aside)
        running = list(w.assignments.values())
        total_rows = sum(a.cost_rows for a in running)
        for a in running:
            # steps it has left: what its time so far bought at the rows running there now
            tau = engine.cost.forward_s(w.worker_id, a.label, total_rows)
            fixed = engine.cost.overhead_s(w.worker_id, a.label) * len(a.entries)
            done = (now - a.sent_at - fixed) / tau if tau > 0 else 0.0
            left = min(float(a.steps), max(0.5, a.steps - max(0.0, done)))
            # on a worker that conditions aside, an assignment still being conditioned has not joined yet
            delay = max(0.0, fixed - (now - a.sent_at)) if w.conditions_aside else 0.0
            sim.preparing = max(sim.preparing, delay)
            sim.items.append(SimItem(tuple((e.request_id, e.slice_index) for e in a.entries), a.rows, a.cost_rows,
                                     left, a.label, a.forward_key, delay))
        sims.append(sim)
    return sims


def _forecast(engine, now: float, queue: list, sizes: dict[str, int | None]) -> dict[str, float]:
    capacity = min(engine.rows_of(w) for w in engine.workers.values())
    jobs = []
    for g in queue:
        jobs.extend(_jobs(g, capacity, sizes.get(g.request_id)))
    return forecast(now, sim_workers(engine, now), jobs, engine.cost.with_margin(), engine.config.batching)


def refuse_at_receipt(engine, group, now: float) -> float | None:
    """The predicted completion when the group's deadline cannot be met even at its minimum, else None."""
    if group.deadline is None or not engine.workers or not all(engine.cost.calibrated(w) for w in engine.workers):
        return None
    queue = order([engine.groups[rid] for rid in engine.queue] + [group], engine.config.best_effort_s)
    sizes = {g.request_id: group.spec.min_count if g is group else _startable_min(g) for g in queue}
    finish = _forecast(engine, now, queue, sizes).get(group.request_id, math.inf)
    return finish if finish > group.deadline else None


def choose_count(engine, group, now: float) -> int:
    """Candidates to serve for a group that has not started (see the module docstring); a binary
    search, since a smaller count never finishes later."""
    spec = group.spec
    if group.deadline is None or spec.min_count >= group.served_count or not engine.workers \
            or not all(engine.cost.calibrated(w) for w in engine.workers):
        return group.served_count
    queue = order([engine.groups[rid] for rid in engine.queue], engine.config.best_effort_s)
    if group not in queue:
        queue.append(group)
    # The groups ahead are forecast too (at their counts as they stand): a group second in the queue
    # that was forecast alone would keep a count it cannot have once the first one starts.
    behind = queue[queue.index(group):]
    others = {g.request_id: _startable_min(g) for g in behind if g is not group}
    # Watched: the deadline groups behind it, and the running ones ahead of it that can still make
    # theirs (its rows slow their forwards too); one already late whatever happens constrains nothing.
    floor = _forecast(engine, now, queue, {**others, group.request_id: spec.min_count})
    ahead = [g for g in queue[:queue.index(group)] if g.deadline is not None and g.status is GroupStatus.RUNNING
             and floor.get(g.request_id, math.inf) <= g.deadline]
    watched = ahead + [g for g in behind if g.deadline is not None]

    def feasible(n: int) -> bool:
        finish = _forecast(engine, now, queue, {**others, group.request_id: n})
        return all(finish.get(g.request_id, math.inf) <= g.deadline for g in watched)

    lo, hi = spec.min_count, group.served_count
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


def backfiller(engine, now: float):
    """The planner's backfill test (core/planning.py rule 4): may `unit` join `worker_id`, which is kept
    for the blocked `head`? Yes when the unit is forecast to be done before the worker would have freed
    enough rows for the head anyway. None (no backfill) while the cost model is not calibrated."""
    if not engine.workers or not all(engine.cost.calibrated(w) for w in engine.workers):
        return None
    cost = engine.cost.with_margin()
    shadows: dict[tuple[str, int], float] = {}

    def shadow(worker_id: str, rows_needed: int) -> float:
        """When the rows running there now will have left enough room for `rows_needed`."""
        key = (worker_id, rows_needed)
        if key not in shadows:
            sim = sim_workers(engine, now, only=worker_id)[0]
            free = sim.capacity - sum(i.rows for i in sim.items)
            items = list(sim.items)
            ends = forecast(now, [sim], [], cost, engine.config.batching)  # runs `sim` down to empty
            at = now
            for item in sorted(items, key=lambda i: max(ends.get(k[0], math.inf) for k in i.keys)):
                if free >= rows_needed:
                    break
                free += item.rows
                at = max(ends.get(k[0], math.inf) for k in item.keys)
            shadows[key] = at if free >= rows_needed else math.inf
        return shadows[key]

    def ok(worker_id: str, head: Unit, unit: Unit) -> bool:
        group = engine.groups.get(unit.request_id)
        if group is None:
            return False
        sim = sim_workers(engine, now, only=worker_id)[0]
        jobs = jobs_of(group, unit.entry)
        return now + duration(cost, sim, jobs) <= shadow(worker_id, head.size)

    return ok
