"""The fluid forecast: a large fleet seen as one pipe, for deadline questions the exact simulation
would answer too slowly.

The exact forecast (core/forecast.py) simulates every start and end on every worker. Asked about a
group behind thousands of queued slices on dozens of workers, that is thousands of events -- and a
burst of deadline groups asks once per group, so the burst costs the square of its length. Here the
fleet is a pipe of known throughput instead:

- at full occupancy worker w runs rows_w candidate rows per step of forward_s(w, rows_w) seconds, so
  the fleet runs R = sum_w rows_w / forward_s(w, rows_w) row-steps per second;
- what the workers run now drains by when each is predicted to be free (each assignment's prediction,
  kept since it was sent), weighted by each worker's share of R;
- the queued slices ahead of a group drain at R (rows x steps each), plus each slice's fixed cost
  (conditioning, postprocess) spread over the workers; they are counted per bucket of the indexed
  queue (core/pending.py), a binary search each, never one by one;
- the group starts once that has drained, then runs its own steps at a full forward.

So a group's predicted finish costs O(buckets + labels x log elastic groups queued), plus the workers
changed since the last question (core/fleet_terms.py keeps the sums over the fleet and mends them for
those: one or two after a result), whatever the queue holds and however many workers there are (the
startable elastic groups ahead give back their excess at their minimum counts, summed by
core/elastic_index.py).
The pipe is the law of large numbers' view of the planner: close when many workers share the queue,
pessimistic by up to one group's own run (it waits for everything ahead to finish, not just to start),
and optimistic when batches run half empty, and on a fleet of unlike workers, where a group's own run
is timed on the fastest worker that holds it (each worker's with its margin) while the planner places
by free rows, not by speed. core/deadlines.py uses it once the exact simulation would have to place
more than `EXACT_LIMIT` slices; below that, the exact one answers.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

from candidate_scheduler.core.planning import Unit
from candidate_scheduler.core.snapshot import GroupView, PlanningSnapshot

EXACT_LIMIT = 128  # queued slices ahead plus the fleet's rows, beyond which the pipe answers
# The deadline groups watched behind an elastic group are planned as if the pipe ran this much slower
# than the margin says. A long burst's head fixes its counts long before its tail runs, with the margin
# learned so far -- and the margin is learned from the burst's own first assignments, on a busy host
# rising as the burst goes (1.0 -> 1.43 in one burst of 1,000 at K = 32). Without the reserve the tail
# was planned to the edge of its deadline at its minimum count, with nothing left to shed: 0-108 of
# 1,000 expired per burst. With it the head leaves candidates the tail sheds if it must (feasibility).
TAIL_RESERVE = 1.2


def exact_enough(snap: PlanningSnapshot, order: tuple) -> bool:
    """Whether the exact simulation is cheap enough for a group at `order` (see the module docstring)."""
    budget = EXACT_LIMIT - snap.terms.total_rows
    return budget > 0 and sum(n for _bucket, n in snap.queue.ahead(order)) <= budget


class Pipe:
    """The fleet as one pipe, for one snapshot (`Pipe.of`). Its sums over the workers are the snapshot's
    fleet terms (core/fleet_terms.py: as planned, each worker's times its margin; kept across decisions
    and mended for the workers that changed); what depends on the queue is kept here, for the snapshot's
    one decision."""

    def __init__(self, snap: PlanningSnapshot):
        self.snap = snap
        self.terms = snap.terms
        self._busy: dict[str, float] = {}  # label -> busy_s
        self._rate: dict[str, float] = {}  # label -> rate
        self._fixed: dict[str, float] = {}  # label -> fixed_s
        self._watched: dict[str, tuple | None] = {}  # request id -> watch_terms
        self._ahead: dict[tuple, float] = {}  # order -> ahead_s
        self._given: dict[tuple, float] = {}  # order -> given_back_before
        # The queue read from its head, as far as a question needed (window_behind): each unit's order and
        # group, whether it begins its group, and before each, the pipe time of the units read. The groups
        # a pass sizes sit near the head: one read serves all.
        self._reader = None
        self._orders: list[tuple] = []
        self._rids: list[str] = []
        self._begins: list[bool] = []
        self._work_before: list[float] = [0.0]

    @classmethod
    def of(cls, snap: PlanningSnapshot) -> Pipe:
        """The snapshot's pipe: a planning pass asks about several groups, each about the same ones behind."""
        pipe = snap.scratch.get(cls)
        if pipe is None:
            pipe = snap.scratch[cls] = cls(snap)
        return pipe

    def rate(self, label: str) -> float:
        """Row-steps per second of the whole fleet at full occupancy, for forwards of `label`."""
        rate = self._rate.get(label)
        if rate is None:  # asked per unit and per bucket: kept for the decision
            rate = self._rate[label] = self.terms.rate(label)
        return rate

    def fixed_s(self, label: str) -> float:
        """A slice's fixed cost (conditioning, postprocess) spread over the fleet: the workers' mean, over
        their number (they condition side by side)."""
        fixed = self._fixed.get(label)
        if fixed is None:
            fixed = self._fixed[label] = self.terms.overhead(label) / len(self.snap.workers) ** 2
        return fixed

    def work_s(self, units) -> float:
        """Seconds of the pipe's time that these slices take (their rows x steps, and their fixed cost)."""
        return sum(u.cost_rows * u.steps / self.rate(u.label) + self.fixed_s(u.label) for u in units)

    def busy_s(self, label: str) -> float:
        """Until what runs now has drained: each worker's predicted remaining time, weighted by its share
        of the pipe."""
        busy = self._busy.get(label)
        if busy is None:
            rate = self.rate(label)  # the row-steps left, at the rate the fleet is planned to run them
            busy = self.terms.busy(label, self.snap.now) / rate if 0 < rate < math.inf else 0.0
            self._busy[label] = busy
        return busy

    def ahead_s(self, order: tuple) -> float:
        """Seconds of the pipe's time that the queued slices ahead of `order` take, as they stand."""
        total = self._ahead.get(order)
        if total is None:
            total = 0.0
            for bucket, count in self.snap.queue.ahead(order):
                total += count * (bucket.cost_rows * bucket.steps / self.rate(bucket.label)
                                  + self.fixed_s(bucket.label))
            self._ahead[order] = total
        return total

    def window_behind(self, view: GroupView, window: int) -> list[tuple[str, float]]:
        """The groups among the `window` units queued right behind `view`, each with the pipe time queued
        ahead of it less what the elastic groups between `view` and it would give back at their minimum."""
        probe = (*view.order, math.inf)  # after every slice of the group's own
        while self._reader is not False and (not self._orders or self._orders[-1] < probe):
            self._read(len(self._orders) + window)
        start = bisect.bisect_left(self._orders, probe)
        self._read(start + window)
        return [(self._rids[i], self._work_before[i] - self.given_back_between(view.order, self._orders[i][:-1]))
                for i in range(start, min(start + window, len(self._orders))) if self._begins[i]]

    def _read(self, upto: int) -> None:
        """Read the queue from its head until `upto` units are read (or it ends: the reader becomes False)."""
        if self._reader is None:
            self._reader = self.snap.queue.ordered()
        while self._reader is not False and len(self._orders) < upto:
            unit = next(self._reader, None)
            if unit is None:
                self._reader = False
                break
            rid = unit.request_id
            self._begins.append(not self._rids or self._rids[-1] != rid)  # a group's slices are contiguous
            self._orders.append(unit.order)
            self._rids.append(rid)
            self._work_before.append(self._work_before[-1] + unit.cost_rows * unit.steps / self.rate(unit.label)
                                     + self.fixed_s(unit.label))

    def given_back_before(self, order: tuple) -> float:
        """The pipe time the startable elastic groups queued ahead of `order` would give back at their
        minimum counts (core/elastic_index.py keeps the sums; (*order, inf): the group at `order` too)."""
        given = self._given.get(order)
        if given is None:
            given = 0.0
            for label, rowsteps, slices in self.snap.elastic.between(None, order, self.snap.slice_capacity):
                given += rowsteps / self.rate(label) + slices * self.fixed_s(label)
            self._given[order] = given
        return given

    def given_back_between(self, after: tuple, before: tuple) -> float:
        """What the startable elastic groups queued between a group at `after` and one at `before` would give
        back at their minimum counts (neither of the two counted)."""
        return max(0.0, self.given_back_before(before) - self.given_back_before((*after, math.inf)))

    def run_s(self, unit: Unit, busy: bool) -> float:
        """One slice's own time on the best worker: its fixed cost and its steps, at a full forward when the
        fleet is busy (it shares its forwards), at its own rows when it is not (inf: no worker holds it)."""
        alone = self.terms.best_run(unit.label, unit.size, unit.cost_rows, unit.steps, False)
        if not busy:
            return alone
        # A full forward is the worker's candidate rows, but a slice of several observations carries more
        # rows than that: never shorter than its own run, or an elastic group of two observations was given
        # a second slice (busy: its own 16 rows timed as 8) and ran 2.1 s against a 1.8 s deadline
        return max(alone, self.terms.best_run(unit.label, unit.size, unit.cost_rows, unit.steps, True))

    def finish(self, units: list[Unit], ahead_s: float) -> float:
        """When a group of these slices ends, with `ahead_s` of the pipe's time before its first starts."""
        if not units:
            return self.snap.now
        return self.finish_after(*self.waiting(units), ahead_s)

    def waiting(self, units: list[Unit]) -> tuple[Unit, float]:
        """A group's last slice (its largest), and the pipe time before that one starts besides what is
        queued ahead of the group: what runs now, and the group's other slices."""
        last = max(units, key=lambda u: u.cost_rows)
        return last, self.busy_s(last.label) + self.work_s([u for u in units if u is not last])

    def finish_after(self, last: Unit, waiting_s: float, ahead_s: float) -> float:
        waiting = waiting_s + ahead_s
        return self.snap.now + waiting + self.run_s(last, waiting > 0)

    def watch_terms(self, request_id: str) -> tuple | None:
        """A queued deadline group as a watched group (feasibility): its deadline, its last slice and what it
        waits for at its minimum count besides the queue ahead (`waiting`). None: no such group, or it has
        no deadline."""
        terms = self._watched.get(request_id, ())
        if terms == ():
            g = self.snap.group(request_id)
            terms = None
            if g is not None and g.deadline is not None:
                terms = (g.deadline, *self.waiting(g.units(g.min_count, self.snap.slice_capacity)))
            self._watched[request_id] = terms
        return terms


def refusal_finish(snap: PlanningSnapshot, view: GroupView, units: list[Unit]) -> float:
    """The pipe's finish of a new group as these units (at its minimum count), every startable elastic
    group ahead of it at its minimum too (core/deadlines.refuse_at_receipt's question)."""
    pipe = Pipe.of(snap)
    ahead = pipe.ahead_s(view.order) - max(0.0, pipe.given_back_before(view.order))
    return pipe.finish(units, ahead)


def feasibility(snap: PlanningSnapshot, view: GroupView, window: int) -> Callable[[int], bool]:
    """Whether, serving n candidates, the group and the deadline groups among the next `window` slices
    queued behind it (at their minimum counts) all finish in time through the pipe -- those behind with
    `TAIL_RESERVE` in hand (core/deadlines.choose_count searches n)."""
    pipe = Pipe.of(snap)
    capacity = snap.slice_capacity
    base = pipe.ahead_s(view.order)
    current = pipe.work_s(snap.queue.units_of(view.request_id))
    # What each watched group waits for, but the group's own count (the pipe time queued ahead of it, less
    # what the elastic groups between would give back at their minimum), from one read of the queue's head
    # that the pass's other counts share; asked once, not per probe
    others = []
    seen: set[str] = set()
    for rid, ahead in pipe.window_behind(view, window):
        seen.add(rid)
        terms = pipe.watch_terms(rid)
        if terms is not None:
            others.append((*terms, ahead))
    # Past the window, a sample (core/pending.PendingIndex.sample_behind), shared by the groups a pass asks
    # about: the queue is in deadline order, so under a burst of like deadlines its last group is the
    # tightest, and counts chosen at the head one window at a time would take what the tail needs
    for unit_order, rid, _slice in snap.queue.sample_behind(view.order, window):
        terms = None if rid in seen else pipe.watch_terms(rid)
        seen.add(rid)
        if terms is not None:
            order = unit_order[:-1]  # the group's (its slices' orders add the slice index)
            others.append((*terms, pipe.ahead_s(order) - pipe.given_back_between(view.order, order)))

    now = snap.now

    def feasible(n: int) -> bool:
        mine = view.units(n, capacity)
        if pipe.finish(mine, base) > view.deadline:
            return False
        delta = pipe.work_s(mine) - current  # what serving n instead of its count now adds ahead of the others
        return all(now + (pipe.finish_after(last, waiting, ahead + delta) - now) * TAIL_RESERVE <= deadline
                   for deadline, last, waiting, ahead in others)

    return feasible
