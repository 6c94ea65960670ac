"""A dispatch batch filled without making a deadline group in it late.

Dispatch batching fills a worker's next batch in queue order: the head of the queue, then later units of
the same batch key while rows are free (core/planning.py). Every unit added makes each forward of the
batch longer, so a group due soon at the head can be made late by a filler due much later: at 8 rows a
forward costs more than at 4, and the head ran past its deadline where it would have finished in time
alone. A unit may join a batch only if every deadline group already in it that would finish in time
without it still finishes in time with it; one late anyway constrains nothing, and neither does the
unit's own group (another slice of it in the batch: kept out, this one would end a batch later). A unit
refused here waits for the next batch -- it came later in the queue, so its own deadline is no earlier.

Nor may a unit lengthen the batch past a deadline group queued AHEAD of it that is not in the batch (it
did not fit the rows left): that group waits for this batch to end, and a filler from behind it -- a group
admitted after it, a best-effort one even -- would push it past the deadline it was admitted for (on one
2-row worker: `soon` heads the batch, `tight` needs both rows, a later 1-row filler joined `soon`, and
`tight` expired). That holds in a batch with no deadline group in it too (a best-effort group that has
waited heads it). The queue (`queued`) is read for that only as far as `SKIP_WINDOW` units; with no live
deadline group at all there is no guard (core/deadlines.batch_guard).

`BatchDeadlines` is that test for one batch; the planner asks it for each candidate (`allows`) and tells
it what joined (`add`). The engine's planning pass and the forecast's replay of it (core/forecast.py)
both use it, so a forecast sees the batches the engine will send. It needs the cost model's time of a
batch (`run_s`) and each group's deadline (`deadline_of`: None for a group without one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice

from candidate_scheduler.core.planning import Unit

SKIP_WINDOW = 64  # queued units read ahead of a filler for deadline groups it would jump


class BatchDeadlines:
    __slots__ = ("start", "run_s", "deadline_of", "queued", "units", "due", "_ends", "_verdicts", "_after",
                 "_ahead", "_reading", "_read_to", "_placed")

    def __init__(self, start: float, run_s: Callable[[Sequence[Unit]], float],
                 deadline_of: Callable[[str], float | None], queued=None):
        self.start = start  # when the batch starts (now, or when the worker's current batch ends)
        self.run_s = run_s
        self.deadline_of = deadline_of
        self.queued = queued  # the pending queue (core/pending.PendingIndex), or None: no look ahead
        self.units: list[Unit] = []
        self.due: dict[str, float] = {}  # request id -> deadline, of the groups in the batch that have one
        self._ends: float | None = None  # the batch's predicted end as it stands (None: not asked yet)
        self._verdicts: dict[tuple, bool] = {}  # per kind of unit, while the batch stands
        self._after: dict[tuple, float] = {}  # per kind of unit: the batch's end with one more of it
        # the deadline groups' units among the first SKIP_WINDOW queued (order, request id, slice index), read
        # as far as `_read_to` (the last order read; None: nothing yet; False: the whole window)
        self._ahead: list[tuple] = []
        self._reading = None
        self._read_to = None
        self._placed: set[tuple[str, int]] = set()  # (request id, slice index) of the units in the batch

    def add(self, unit: Unit) -> None:
        self.units.append(unit)
        self._placed.add((unit.request_id, unit.slice_index))
        deadline = self.deadline_of(unit.request_id)
        if deadline is not None:
            self.due[unit.request_id] = deadline
        if self._after:  # `allows` worked out the batch's end with it (or with one like it)
            self._ends = self._after.get(_kind(unit))
            self._verdicts.clear()
            self._after.clear()
        else:
            self._ends = None

    def allows(self, unit: Unit) -> bool:
        if not self.due and self.queued is None:
            return True  # nothing in it is due, nothing ahead is read
        # the units of one pending bucket are alike here (rows, steps, label): one verdict for them all, but
        # for a slice of a group in the batch, which that group's deadline does not hold back
        own = unit.request_id if unit.request_id in self.due else None
        kind = _kind(unit)
        verdict = self._verdicts.get((kind, own))
        if verdict is None:
            if self._ends is None:
                self._ends = self.start + self.run_s(self.units)
            ends = self._after[kind] = self.start + self.run_s([*self.units, unit])
            verdict = self._verdicts[(kind, own)] = all(
                ends <= d or self._ends > d for rid, d in self.due.items() if rid != own)
        # asked last, and only of a unit that makes the batch longer: it reads the queue
        return verdict and not (self._after[kind] > self._ends and self._jumps(unit))

    def _jumps(self, unit: Unit) -> bool:
        """Whether a deadline group of another's is queued ahead of `unit` with a slice not in the batch. The
        queue is read once a batch, lazily, only as far as the units asked about (the index does not change
        while a pass plans)."""
        if self.queued is None:
            return False
        if self._reading is None:
            self._reading = islice(self.queued.ordered(), SKIP_WINDOW)
        while self._read_to is not False and (self._read_to is None or self._read_to < unit.order):
            ahead = next(self._reading, None)
            if ahead is None:
                self._read_to = False  # the window is read
                break
            self._read_to = ahead.order
            if self.deadline_of(ahead.request_id) is not None:
                self._ahead.append((ahead.order, ahead.request_id, ahead.slice_index))
        for order, rid, slice_index in self._ahead:
            if order >= unit.order:
                return False
            if rid != unit.request_id and (rid, slice_index) not in self._placed:
                return True
        return False


def _kind(unit: Unit) -> tuple:
    return (unit.cost_rows, unit.steps, unit.label)
