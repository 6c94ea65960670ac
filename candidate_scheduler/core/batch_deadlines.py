"""A dispatch batch filled without making a deadline group in it late.

Dispatch batching fills a worker's next batch in queue order: the head of the queue, then later units of
the same batch key while rows are free (core/planning.py). Every unit added makes each forward of the
batch longer, so a group due soon at the head can be made late by a filler due much later: at 8 rows a
forward costs more than at 4, and the head ran past its deadline where it would have finished in time
alone. A unit may join a batch only if every deadline group already in it that would finish in time
without it still finishes in time with it; one late anyway constrains nothing, and neither does the
unit's own group (another slice of it in the batch: kept out, this one would end a batch later). A unit
refused here waits for the next batch -- it came later in the queue, so its own deadline is no earlier.

`BatchDeadlines` is that test for one batch; the planner asks it for each candidate (`allows`) and tells
it what joined (`add`). The engine's planning pass and the forecast's replay of it (core/forecast.py)
both use it, so a forecast sees the batches the engine will send. It needs the cost model's time of a
batch (`run_s`) and each group's deadline (`deadline_of`: None for a group without one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from candidate_scheduler.core.planning import Unit


class BatchDeadlines:
    __slots__ = ("start", "run_s", "deadline_of", "units", "due", "_ends", "_verdicts", "_after")

    def __init__(self, start: float, run_s: Callable[[Sequence[Unit]], float],
                 deadline_of: Callable[[str], float | None]):
        self.start = start  # when the batch starts (now, or when the worker's current batch ends)
        self.run_s = run_s
        self.deadline_of = deadline_of
        self.units: list[Unit] = []
        self.due: dict[str, float] = {}  # request id -> deadline, of the groups in the batch that have one
        self._ends: float | None = None  # the batch's predicted end as it stands (None: not asked yet)
        self._verdicts: dict[tuple, bool] = {}  # per kind of unit, while the batch stands
        self._after: dict[tuple, float] = {}  # per kind of unit: the batch's end with one more of it

    def add(self, unit: Unit) -> None:
        self.units.append(unit)
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
        if not self.due:
            return True  # nothing in it is due: the common case without deadlines costs one check
        # the units of one pending bucket are alike here (rows, steps, label): one verdict for them all, but
        # for a slice of a group in the batch, which that group's deadline does not hold back
        own = unit.request_id if unit.request_id in self.due else None
        verdict = self._verdicts.get((_kind(unit), own))
        if verdict is None:
            if self._ends is None:
                self._ends = self.start + self.run_s(self.units)
            ends = self._after[_kind(unit)] = self.start + self.run_s([*self.units, unit])
            verdict = self._verdicts[(_kind(unit), own)] = all(
                ends <= d or self._ends > d for rid, d in self.due.items() if rid != own)
        return verdict


def _kind(unit: Unit) -> tuple:
    return (unit.cost_rows, unit.steps, unit.label)
