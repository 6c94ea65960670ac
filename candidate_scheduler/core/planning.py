"""Which pending slices go to which worker, under both batching modes, read from the indexed queue.

A *unit* is one pending slice of one admitted group; the queue (core/pending.py) keeps units in queue
order (groups earliest effective deadline first, core/deadlines.py: receipt order among groups without
one; slices ascending). Admission sized every slice to fit the smallest live worker, so a unit is never
split here. A planning pass never changes the queue: it returns placements, and walks the queue only
as far as it can place (each rule below says when it stops).

Dispatch-level batching (`plan_dispatch`): only idle workers get work -- or, with prefetch, a worker
running one batch gets the next, which it starts when the current one ends; truly idle workers come
first. Each of them, largest first, gets one physical batch: the earliest unit it can hold (the head
of line always goes into the next batch), then, first-fit in queue order, later units of the same
batch key that still fit (core/microbatch.py states the rule and its consequences) and that `guard`
lets in: none that would make a deadline group in the batch, or queued ahead of the unit, late
(core/batch_deadlines.py). The batch runs from its first step to its last before that worker gets more.
A pass stops when no idle worker is left.

Step-level batching (`plan_step`): a worker takes units while it has free rows; a unit joins the
worker's running batch at its next step boundary. The rule:

1. Units are placed in queue order. A unit may go to a worker with enough free rows whose running rows
   have the same forward key (shape, CFG on/off), or to an idle worker.
2. Among those, the worker with the fewest free rows that still fit wins (best fit: rows are packed
   into shared forwards, and whole workers stay free for large groups). A worker may also hold `spare`
   rows beyond its capacity (prefetch): work placed there waits on the worker and joins at the first
   step boundary with room, instead of a network round trip later; a unit goes there only when no
   worker has free rows for it now.
3. A unit that no worker can take now is *blocked*. It reserves one worker that could ever hold it
   (capacity >= its size), the one with the most free rows. A reserved worker takes no later unit, so
   it drains until the blocked unit fits. Reservations are derived from the queue afresh every time
   planning runs, so while the head of the queue stays blocked it keeps its reservation: a large group
   at the head is never starved by a stream of small groups joining ahead of it, and small groups still
   flow to the workers nobody reserved.
4. Backfill (EASY backfilling, with the cost model): a later unit may still join a reserved worker when
   it fits the worker's free rows now (not its spare rows, where it would wait and then join ahead of
   the head) and `backfill(worker, head, unit)` says it will be done before the worker would have freed
   enough rows for the head anyway -- it uses rows that would idle. That is a forecast (with the measured safety
   margin), checked against the worker as it runs now: several backfills in one planning pass are each
   checked alone, so the head can be delayed by as much as the forecast errs. Without a calibrated cost
   model there is no backfill, and rule 3 holds as stated.

Why a pass stops early. Units of one bucket are alike to every rule above, and during a pass free rows
only shrink and reservations only grow: once a unit is blocked and can reserve nobody, every later unit
of its bucket would be too (a worker reserved later did not accept it before, so it cannot backfill
it), and the pass leaves the whole bucket. It stops when no worker has a free row, or when every worker
is reserved and nothing may backfill. So a pass looks at the units it places, at most one per worker it
reserves, and one per bucket: not at the queue behind them. A unit's best worker (rules 1, 2 and 4) is
found by a scan of the pass's slots, or past `SCAN_LIMIT` of them from an index by forward key and rows
left (`_SlotIndex`): a wave on a large fleet places thousands of units over hundreds of slots.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from candidate_scheduler.core.microbatch import BatchEntry, BatchKey
from candidate_scheduler.core.pending import PendingIndex
from candidate_scheduler.core.values import value


@value
class Unit:
    """One pending slice as planning and the forecast see it: who, how many rows, how much work."""

    request_id: str
    slice_index: int
    candidate_ids: tuple[int, ...]
    batch_key: BatchKey | tuple
    forward_key: tuple
    order: tuple = ()  # queue position: (effective deadline, admission order, slice index)
    steps: int = 0
    cost_rows: int = 0  # rows a forward carries: candidates x observations
    label: str = ""  # forward label (cost model key)
    wire_bytes: int = 0  # its weight in an assignment message (GroupRequest.wire_bytes)
    size: int = field(init=False, repr=False, compare=False)  # candidate rows: read a dozen times per pass

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.candidate_ids))

    @property
    def entry(self) -> BatchEntry:
        return BatchEntry(self.request_id, self.slice_index, self.candidate_ids)


@dataclass
class WorkerSlot:
    """What planning needs to know of a worker; `free_rows`, `spare` and `forward_key` change as it plans."""

    worker_id: str
    capacity: int
    free_rows: int
    forward_key: tuple | None  # of its running rows; None when idle
    spare: int = 0  # rows it may hold beyond its capacity, waiting there for rows to free (prefetch)
    refuses: frozenset[str] = frozenset()  # forward labels one candidate of which ran it out of memory

    def accepts(self, unit: Unit) -> bool:
        return (unit.size <= self.capacity and self.free_rows + self.spare >= unit.size
                and self.forward_key in (None, unit.forward_key) and unit.label not in self.refuses)

    def fit(self, unit: Unit) -> tuple:
        """Best fit first: a unit that runs now (in free rows) before one that would wait there (spare
        rows); then the fewest rows left; then a running batch before an idle worker."""
        now = unit.size <= self.free_rows
        return (not now, self.free_rows if now else self.free_rows + self.spare, self.forward_key is None)

    def take(self, unit: Unit) -> None:
        from_free = min(unit.size, self.free_rows)
        self.free_rows -= from_free
        self.spare -= unit.size - from_free
        self.forward_key = unit.forward_key


def dispatch_class(unit: Unit):
    """What must match for units to share a dispatch batch."""
    return unit.batch_key


def step_class(unit: Unit):
    """What must match for units to share a forward (and so a running batch)."""
    return unit.forward_key


def plan_dispatch(queue: PendingIndex, idle: list[WorkerSlot], on_unit: Callable[[str], None] | None = None,
                  guard: Callable[[str], Any] | None = None) -> list[tuple[str, tuple[Unit, ...]]]:
    """One physical batch for each idle worker that has work, largest worker first; each batch's units
    in queue order. `on_unit(request_id)` is told of each unit as it is considered. `guard(worker_id)`:
    a BatchDeadlines for the batch filled there (its `allows` and `add`), or None for no test."""
    plans: list[tuple[str, tuple[Unit, ...]]] = []
    walk = queue.walk()
    # idle workers first (a busy one that may hold its next batch runs it only after the current one)
    for worker in sorted(idle, key=lambda w: (w.forward_key is not None, -w.capacity)):
        capacity, refuses = worker.capacity, worker.refuses
        found = walk.first((lambda b, cap=capacity: b.size <= cap) if not refuses else
                           (lambda b, cap=capacity, no=refuses: b.size <= cap and b.label not in no))
        if found is None:
            continue  # a larger worker further on (a busy one that may hold its next batch) may take some
        bucket, head = found
        if on_unit is not None:
            on_unit(head.request_id)
        walk.take(bucket)
        units, used, kind = [head], head.size, bucket.class_key
        batch = None if guard is None else guard(worker.worker_id)
        if batch is not None:
            batch.add(head)
        while used < capacity:
            room = capacity - used
            found = walk.first(lambda b, room=room, kind=kind, batch=batch: b.size <= room and b.class_key == kind
                               and (batch is None or batch.allows(walk.head(b))))
            if found is None:
                break
            if on_unit is not None:
                on_unit(found[1].request_id)
            walk.take(found[0])
            units.append(found[1])
            used += found[1].size
            if batch is not None:
                batch.add(found[1])
        plans.append((worker.worker_id, tuple(units)))
    return plans


def plan_step(queue: PendingIndex, workers: list[WorkerSlot],
              backfill: Callable[[str, Unit, Unit], bool] | None = None,
              on_unit: Callable[[str], None] | None = None) -> list[tuple[str, Unit]]:
    """(worker id, unit) placements, in queue order (see the module docstring for the rule).
    `on_unit(request_id)` is told of each unit as it is considered."""
    placements: list[tuple[str, Unit]] = []
    reserved: dict[str, Unit] = {}  # worker id -> the blocked unit it is kept for
    verdicts: dict[tuple, bool] = {}  # (worker, head rows, bucket) -> may backfill: fixed for the pass
    walk = queue.walk()
    free = sum(w.free_rows + w.spare for w in workers)

    def may_backfill(w: WorkerSlot, bucket, unit: Unit) -> bool:
        head = reserved[w.worker_id]
        key = (w.worker_id, head.size, bucket.key)
        if key not in verdicts:
            verdicts[key] = backfill(w.worker_id, head, unit)
        return verdicts[key]

    index = _SlotIndex(workers) if len(workers) > SCAN_LIMIT else None
    while free > 0 and (found := walk.first()) is not None:
        bucket, unit = found
        if on_unit is not None:
            on_unit(unit.request_id)

        def allowed(w: WorkerSlot, bucket=bucket, unit=unit) -> bool:
            # a backfill must start now, in free rows: in spare rows it would wait on the worker and join
            # when rows free, ahead of the head it was judged against as if it had started at once
            if unit.label in w.refuses:
                return False
            return w.worker_id not in reserved or (backfill is not None and unit.size <= w.free_rows
                                                   and may_backfill(w, bucket, unit))

        if index is not None:
            best = index.best(unit, allowed)
        else:
            best = min((w for w in workers if w.accepts(unit) and allowed(w)), key=lambda w: w.fit(unit), default=None)
        if best is not None:
            if index is not None:
                index.take(best, unit)
            else:
                best.take(unit)
            free -= unit.size
            placements.append((best.worker_id, unit))
            walk.take(bucket)
            continue
        holders = [w for w in workers if w.worker_id not in reserved and w.capacity >= unit.size
                   and unit.label not in w.refuses]
        if not holders:
            walk.drop(bucket)  # blocked and reserving nobody: so is every later unit of its bucket
            continue
        reserved[max(holders, key=lambda w: w.free_rows).worker_id] = unit
        walk.take(bucket)
        if len(reserved) == len(workers) and backfill is None:
            break
    return placements


SCAN_LIMIT = 8  # slots in a pass up to which a unit's best one is found by a scan (an index costs more to build)


class _SlotIndex:
    """A step pass's slots by the forward key of their running rows, each kind ordered by the rows a unit
    would leave (`WorkerSlot.fit`), so that a unit's best slot costs O(log slots), not a scan: a wave of
    rows freed on a large fleet (every worker's batch ending together) places thousands of units in one
    pass. Ties go to the earlier slot, as the scan's min() does."""

    def __init__(self, slots: list[WorkerSlot]) -> None:
        self.slots = slots
        self.at = {id(w): i for i, w in enumerate(slots)}
        self.now: dict = {}  # forward key -> sorted (free rows, position): the unit runs there now
        self.room: dict = {}  # forward key -> sorted (free + spare rows, position): it may wait there
        for i in range(len(slots)):
            self._file(i, bisect.insort)

    def _file(self, i: int, how) -> None:
        w = self.slots[i]
        if w.free_rows:
            how(self.now.setdefault(w.forward_key, []), (w.free_rows, i))
        if w.free_rows + w.spare:
            how(self.room.setdefault(w.forward_key, []), (w.free_rows + w.spare, i))

    @staticmethod
    def _unfile(entries: list, entry: tuple) -> None:
        del entries[bisect.bisect_left(entries, entry)]

    def take(self, w: WorkerSlot, unit: Unit) -> None:
        i = self.at[id(w)]
        self._file(i, self._unfile)
        w.take(unit)
        self._file(i, bisect.insort)

    def best(self, unit: Unit, allowed: Callable[[WorkerSlot], bool]) -> WorkerSlot | None:
        """The slot `min(accepting, key=fit)` would pick among those `allowed`, or None."""
        keys = (None,) if unit.forward_key is None else (None, unit.forward_key)
        for kinds, runs_now in ((self.now, True), (self.room, False)):  # any slot where it runs now wins
            best = None
            for key in keys:
                entries = kinds.get(key, ())
                for j in range(bisect.bisect_left(entries, (unit.size, -1)), len(entries)):
                    rows, i = entries[j]
                    w = self.slots[i]
                    if (runs_now or w.capacity >= unit.size) and allowed(w):
                        candidate = (rows, key is None, i)  # WorkerSlot.fit, then the slots' order
                        if best is None or candidate < best:
                            best = candidate
                        break
            if best is not None:
                return self.slots[best[2]]
        return None
