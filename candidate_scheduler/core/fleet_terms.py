"""The fluid forecast's sums over the fleet (core/fluid.py), kept across decisions and mended for the
workers that changed.

The pipe reads the fleet through a few sums over every worker: its row-steps per second at full
occupancy, the fixed cost of a slice, a slice's best time alone, and the work running now, weighted by
when each worker is predicted to be free. The staggered starts read the shortest and longest batch
period and each worker's predicted end (`FleetTerms.ends`), and late prefetch the workers in order of
when work for them is due (`FleetTerms.due`). A result changes one worker: its cost model learns from
the result and its view loses the assignment. Recomputing all of that after each result made every
pass, wake-up and deadline question after it read the whole fleet, O(workers). Here each sum or order
keeps its terms, one per worker, and when asked recomputes only the terms of the workers changed since
it was last asked: the positions whose view was rebuilt (core/worker_views.py) and those whose cost
model learnt (CostModel.changes). A worker that comes or goes, or whose rows change, moves every position: then
everything starts over.

The pipe's sums are planned: each worker's term is times its forecast margin (core/margins.py), whose
change is a change of that worker's cost model like any other. The staggered starts' and late
prefetch's terms are unscaled, as the planner's predictions are. A sum kept by subtracting and adding
drifts by rounding; each is recomputed whole after as many updates as the fleet has workers (amortised
O(1)).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping

import numpy as np

from candidate_scheduler.core.cost_model import Scaled


class FleetTerms:
    """The sums for the worker views `workers` (a snapshot's tuple) and the unscaled cost model `cost`."""

    def __init__(self, workers: tuple, cost, views_stamp: int = 0) -> None:
        self.workers = workers
        self.cost = cost
        self.planned = Scaled(cost)  # each worker's durations times its margin
        self._views_stamp = views_stamp  # read up to here in the views' change log
        self._cost_stamp = cost.version  # and in the cost model's
        self._log: list[int] = []  # the positions changed since the sums below were started, in order
        self._sums: dict[tuple, _Sum] = {}
        self._mins: dict[tuple, _Min] = {}
        self._busy: dict[str, _Busy] = {}
        self._ordered: dict[str, _Ordered] = {}
        self._values: dict[str, _Values] = {}
        self._lead_of: Callable | None = None  # due(): the lead of late prefetch, while its terms are computed
        self._rows: tuple[int, int | None, int] | None = None  # _row_counts: they change only with every position

    def follow(self, workers: tuple, views_log, positions: Mapping[str, int]) -> FleetTerms:
        """These sums brought up to `workers` (the engine's views now), given the views' change log and the
        workers' positions; a fresh FleetTerms when a log lost track (the positions moved)."""
        if workers is self.workers and self.cost.version == self._cost_stamp:
            return self
        rebuilt, learnt = views_log.since(self._views_stamp), self.cost.changes.since(self._cost_stamp)
        if rebuilt is None or learnt is None:
            return FleetTerms(workers, self.cost, views_log.stamp)
        self.workers = workers
        self._views_stamp, self._cost_stamp = views_log.stamp, self.cost.version
        self._log += rebuilt
        self._log += [positions[wid] for wid in learnt if wid in positions]  # a forgotten worker has left
        if len(self._log) > 4 * len(workers) + 64:  # every sum is started again when next asked
            self._log.clear()
            self._sums.clear()
            self._mins.clear()
            self._busy.clear()
            self._ordered.clear()
            self._values.clear()
        return self

    # ---- the answers ---------------------------------------------------------------------------------------

    @property
    def total_rows(self) -> int:
        return self._row_counts()[0]

    @property
    def min_rows(self) -> int:
        """The smallest worker's rows (ValueError with no worker, as min() of nothing)."""
        smallest = self._row_counts()[1]
        if smallest is None:
            raise ValueError("no workers: no smallest rows")
        return smallest

    def rate(self, label: str) -> float:
        """Row-steps per second of the fleet at full occupancy, for forwards of `label`, as planned (each
        worker's slowed by its margin; inf: some worker's forward is predicted to take no time)."""
        entry = self._sums.get(("rate", label))
        if entry is None:
            entry = self._sums[("rate", label)] = _Sum(lambda i: self._rate_of(i, label, self.planned),
                                                       len(self.workers), len(self._log))
        return self._fresh(entry).value

    def overhead(self, label: str) -> float:
        """The workers' fixed costs per slice (conditioning, postprocess), as planned, summed."""
        entry = self._sums.get(("overhead", label))
        if entry is None:
            entry = self._sums[("overhead", label)] = _Sum(
                lambda i: self.planned.overhead_s(self.workers[i].worker_id, label), len(self.workers),
                len(self._log))
        return self._fresh(entry).value

    def best_run(self, label: str, size: int, cost_rows: int, steps: int, busy: bool) -> float:
        """A slice's shortest time alone on a worker that holds `size` rows, as planned: its fixed cost and
        `steps` forwards, at the worker's full rows when `busy`, else at `cost_rows` (inf: no worker holds
        it)."""
        key = (label, size, cost_rows, steps, busy)
        entry = self._mins.get(key)
        if entry is None:
            def term(i: int) -> float:
                w = self.workers[i]
                if w.rows < size:
                    return math.inf
                return self.planned.overhead_s(w.worker_id, label) \
                    + steps * self.planned.forward_s(w.worker_id, label, w.rows if busy else cost_rows)
            entry = self._mins[key] = _Min(term, len(self.workers), len(self._log))
        return self._fresh(entry).value

    def periods(self, label: str, size: int, cost_rows: int, steps: int) -> tuple[float, float, float, int]:
        """A full batch of these slices, back to back, on each worker that runs any rows (core/stagger.py:
        its `steps` forwards of as many slices as it holds, plus their conditioning unless it conditions
        aside, overlapped with the batch before): (the first such worker's, the shortest, the longest,
        how many such workers there are); (inf, inf, -inf, 0) when none."""
        def period(i: int) -> float:
            w = self.workers[i]
            if not w.rows:
                return math.inf  # a worker told 0 rows runs nothing
            units = max(1, w.rows // size)
            value = steps * self.cost.forward_s(w.worker_id, label, units * cost_rows)
            if not w.conditions_aside:
                value += units * self.cost.overhead_s(w.worker_id, label)
            return value

        key = (label, size, cost_rows, steps)
        shortest = self._mins.get(("period", *key))
        if shortest is None:
            shortest = self._mins[("period", *key)] = _Min(period, len(self.workers), len(self._log))
            self._mins[("-period", *key)] = _Min(lambda i: -period(i) if self.workers[i].rows else math.inf,
                                                 len(self.workers), len(self._log))
        shortest, longest = self._fresh(shortest).value, -self._fresh(self._mins[("-period", *key)]).value
        live = self._row_counts()[2]
        if not live:
            return math.inf, math.inf, -math.inf, 0
        first = period(next(i for i, w in enumerate(self.workers) if w.rows))
        return first, shortest, longest, live

    def busy(self, label: str, now: float) -> float:
        """The row-steps still to run: the sum over the workers running something of their rate (unscaled)
        times the seconds until they are predicted to be free (0 once that has passed); workers of no
        finite, positive rate are left out."""
        entry = self._busy.get(label)
        if entry is None:
            def term(i: int) -> tuple[float, float] | None:
                w, rate = self.workers[i], self._rate_of(i, label, self.cost)
                return (w.busy_until, rate) if w.running and 0 < rate < math.inf else None
            entry = self._busy[label] = _Busy(term, len(self.workers), len(self._log), now)
        return self._fresh(entry).total(now)

    def ends(self) -> np.ndarray:
        """Per position, when what the worker holds is predicted to be done (`busy_until`); NaN for a worker
        that runs nothing or is told 0 rows (the staggered starts' boundaries, core/snapshot.py). The
        caller must not change it."""
        entry = self._values.get("ends")
        if entry is None:
            entry = self._values["ends"] = _Values(self._end, len(self.workers), len(self._log))
        return self._fresh(entry).values

    def _end(self, i: int) -> float:
        w = self.workers[i]
        return w.busy_until if w.rows and w.running else math.nan

    def due(self, kind: str, lead_of: Callable) -> _Ordered:
        """The workers in order of when work for them is due, under late prefetch (core/snapshot.py), with
        the scheduler's timing known (calibrated):

        - "batch" (dispatch): the workers that may take a batch, at once when idle (-inf), else `lead_of`
          before the batch they hold is predicted to end (before any staggered start);
        - "rows" (step): the workers with rows to fill, at once when some are free (-inf), else when the
          running assignments predicted to end within `lead_of` free more rows than the worker holds
          beyond its capacity (the first instant `spare_due` is above 0);
        - "ends" (step): each running assignment's predicted end less `lead_of`, of the workers with
          spare rows (one entry per assignment): the instants a step pass may wake for.

        `lead_of` must answer alike for every snapshot of one engine: what it reads changes only with a
        worker's view or cost model (the margin a worker shows it needs is learnt from the result that
        rebuilds its view)."""
        entry = self._ordered.get(kind)
        self._lead_of = lead_of
        try:
            if entry is None:
                term = {"batch": self._batch_due, "rows": self._rows_due, "ends": self._ends_less_lead}[kind]
                entry = self._ordered[kind] = _Ordered(term, len(self.workers), len(self._log))
            return self._fresh(entry)
        finally:
            self._lead_of = None  # the snapshot it belongs to is not kept alive by these sums

    def _batch_due(self, i: int) -> tuple[float, ...]:
        w = self.workers[i]
        if not w.takes_a_batch:
            return ()
        return (w.busy_until - self._lead_of(w) if w.running else -math.inf,)

    def _rows_due(self, i: int) -> tuple[float, ...]:
        w = self.workers[i]
        if w.free_rows:
            return (-math.inf,)
        if not w.spare or not w.running:
            return ()  # no row to fill until its view changes
        lead, held, freeing = self._lead_of(w), max(0, sum(a.rows for a in w.running) - w.rows), 0
        for end, rows in sorted((a.ends_at - lead, a.rows) for a in w.running):
            freeing += rows
            if freeing > held:
                return (end,)
        return ()

    def _ends_less_lead(self, i: int) -> tuple[float, ...]:
        w = self.workers[i]
        if not w.spare:
            return ()
        lead = self._lead_of(w)
        return tuple(a.ends_at - lead for a in w.running)

    # ---- upkeep ----------------------------------------------------------------------------------------------

    def _rate_of(self, i: int, label: str, cost) -> float:
        w = self.workers[i]
        step = cost.forward_s(w.worker_id, label, w.rows)
        return w.rows / step if step > 0 else math.inf

    def _row_counts(self) -> tuple[int, int | None, int]:
        """(the rows of all workers, the smallest worker's (None: no worker), how many run any rows)."""
        if self._rows is None:
            rows = [w.rows for w in self.workers]
            self._rows = (sum(rows), min(rows, default=None), sum(1 for r in rows if r))
        return self._rows

    def _fresh(self, entry):
        """`entry` with the terms of the positions changed since it was last asked recomputed (whole when
        that is many, or when it has been mended as often as there are workers)."""
        if entry.seen < len(self._log):
            changed = set(self._log[entry.seen:])
            if 4 * len(changed) > len(self.workers) or entry.updates >= len(self.workers):
                entry.rebuild()
            else:
                for i in changed:
                    entry.update(i)
            entry.seen = len(self._log)
        return entry


class _Sum:
    """Sum of term(i) over the workers; the infinite terms are counted apart (inf - inf is NaN)."""

    def __init__(self, term: Callable[[int], float], n: int, seen: int) -> None:
        self.term, self.n, self.seen = term, n, seen
        self.rebuild()

    def rebuild(self) -> None:
        self.terms = [self.term(i) for i in range(self.n)]
        self.infinite = sum(1 for t in self.terms if t == math.inf)
        self.finite = sum(t for t in self.terms if t != math.inf)
        self.updates = 0

    def update(self, i: int) -> None:
        old = self.terms[i]
        new = self.terms[i] = self.term(i)
        self.infinite += (new == math.inf) - (old == math.inf)
        before = self.finite
        self.finite += (new if new != math.inf else 0.0) - (old if old != math.inf else 0.0)
        self.updates += 1
        if old != math.inf and abs(old) > 0.5 * abs(before):
            # The term taken out was most of the total, so what is left holds its rounding error, not the
            # others' sum: one worker rated at 1e301 rows/s and then at its true rate left the fleet's rate
            # at that worker's alone. Sum afresh (O(workers), and only while one term is most of the sum).
            self.rebuild()

    @property
    def value(self) -> float:
        return math.inf if self.infinite else self.finite


class _Min:
    """The smallest term(i) over the workers (inf with none)."""

    def __init__(self, term: Callable[[int], float], n: int, seen: int) -> None:
        self.term, self.n, self.seen = term, n, seen
        self.rebuild()

    def rebuild(self) -> None:
        self.terms = [self.term(i) for i in range(self.n)]
        self.value = min(self.terms, default=math.inf)
        self.updates = 0

    def update(self, i: int) -> None:
        old = self.terms[i]
        new = self.terms[i] = self.term(i)
        if new <= self.value:
            self.value = new
        elif old == self.value:  # the smallest grew: another may be smallest now
            self.value = min(self.terms)
        self.updates += 1


class _Values:
    """term(i) for every worker, in an array by position."""

    def __init__(self, term: Callable[[int], float], n: int, seen: int) -> None:
        self.term, self.n, self.seen = term, n, seen
        self.rebuild()

    def rebuild(self) -> None:
        self.values = np.fromiter((self.term(i) for i in range(self.n)), dtype=float, count=self.n)
        self.updates = 0

    def update(self, i: int) -> None:
        self.values[i] = self.term(i)
        self.updates += 1


class _Ordered:
    """The workers' terms, each a tuple of keys (empty: left out), all keys in one order."""

    def __init__(self, term: Callable[[int], tuple[float, ...]], n: int, seen: int) -> None:
        self.term, self.n, self.seen = term, n, seen
        self.rebuild()

    def rebuild(self) -> None:
        self.terms = [self.term(i) for i in range(self.n)]
        self.order = sorted((key, i) for i, keys in enumerate(self.terms) for key in keys)
        self.updates = 0

    def update(self, i: int) -> None:
        for key in self.terms[i]:
            del self.order[bisect.bisect_left(self.order, (key, i))]
        self.terms[i] = self.term(i)
        for key in self.terms[i]:
            bisect.insort(self.order, (key, i))
        self.updates += 1

    def upto(self, t: float) -> list[int]:
        """The positions with a key at most t, in order of their keys (a position once per key)."""
        return [i for _key, i in self.order[:bisect.bisect_right(self.order, (t, math.inf))]]

    def first_above(self, t: float) -> float | None:
        """The smallest key above t (None: none)."""
        j = bisect.bisect_right(self.order, (t, math.inf))
        return self.order[j][0] if j < len(self.order) else None


class _Busy:
    """Sum over the workers with a term (end, rate) of rate x max(0, end - now): the sums of rate x end
    and of rate over all of them, less those over the ones whose end has passed. Those are a prefix of
    the terms in order of their ends, whose length follows the time asked about (it only grows while
    time does): so an answer costs the ends passed since the last, not the fleet."""

    def __init__(self, term: Callable[[int], tuple[float, float] | None], n: int, seen: int, now: float) -> None:
        self.term, self.n, self.seen = term, n, seen
        self.base = now  # times are kept less this: the sums' magnitudes stay small
        self.t = 0.0  # the last time asked about, less base
        self.rebuild()

    def rebuild(self) -> None:
        self.terms = [self._relative(self.term(i)) for i in range(self.n)]
        self.ends = sorted((t[0], i) for i, t in enumerate(self.terms) if t is not None)
        self.rate_end = sum(t[0] * t[1] for t in self.terms if t is not None)
        self.rate = sum(t[1] for t in self.terms if t is not None)
        self.passed, self.passed_rate_end, self.passed_rate = 0, 0.0, 0.0  # the prefix ends[:passed]
        self._move_to(self.t)
        self.updates = 0

    def _relative(self, term: tuple[float, float] | None) -> tuple[float, float] | None:
        return None if term is None else (term[0] - self.base, term[1])

    def _move_to(self, t: float) -> None:
        ends, terms = self.ends, self.terms
        while self.passed < len(ends) and ends[self.passed][0] <= t:
            end, rate = terms[ends[self.passed][1]]
            self.passed_rate_end += end * rate
            self.passed_rate += rate
            self.passed += 1
        while self.passed and ends[self.passed - 1][0] > t:
            self.passed -= 1
            end, rate = terms[ends[self.passed][1]]
            self.passed_rate_end -= end * rate
            self.passed_rate -= rate
        self.t = t

    def update(self, i: int) -> None:
        old = self.terms[i]
        new = self.terms[i] = self._relative(self.term(i))
        if old is not None:
            del self.ends[bisect.bisect_left(self.ends, (old[0], i))]
            self.rate_end -= old[0] * old[1]
            self.rate -= old[1]
            if old[0] <= self.t:  # it was in the passed prefix
                self.passed -= 1
                self.passed_rate_end -= old[0] * old[1]
                self.passed_rate -= old[1]
        if new is not None:
            bisect.insort(self.ends, (new[0], i))
            self.rate_end += new[0] * new[1]
            self.rate += new[1]
            if new[0] <= self.t:
                self.passed += 1
                self.passed_rate_end += new[0] * new[1]
                self.passed_rate += new[1]
        self.updates += 1

    def total(self, now: float) -> float:
        t = now - self.base
        self._move_to(t)
        return max(0.0, (self.rate_end - self.passed_rate_end) - t * (self.rate - self.passed_rate))
