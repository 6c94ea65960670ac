"""What a planning decision may read: a typed view of the engine at one instant.

The engine builds a `PlanningSnapshot` for each decision (a planning pass, a submission's refusal
check) and the decisions -- core/schedule.py, core/deadlines.py -- read only it: the workers and the
work each runs, the cost model and its margin, the pending queue (core/pending.py) and a view of any
queued group. A snapshot is valid while the engine does not change, which is the length of one
decision: the queue and the group views are read through, not copied, so building one costs
O(workers x assignments), never O(queue).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import field
from functools import cached_property

import numpy as np

from candidate_scheduler.core.admission import split_balanced
from candidate_scheduler.core.cost_model import CostModel, Scaled
from candidate_scheduler.core.elastic_index import ElasticIndex
from candidate_scheduler.core.fleet_terms import FleetTerms
from candidate_scheduler.core.forecast import SimItem, SimWorker
from candidate_scheduler.core.pending import PendingIndex
from candidate_scheduler.core.planning import Unit, WorkerSlot
from candidate_scheduler.core.stagger import MIN_SPACING_S, deep, delay, mixed
from candidate_scheduler.core.values import value


@value
class RunningWork:
    """One assignment a worker holds."""

    batch_id: int
    keys: tuple[tuple[str, int], ...]  # (request id, slice index) of its slices
    rows: int
    cost_rows: int
    steps: int
    label: str
    forward_key: tuple
    sent_at: float
    predicted_s: float = 0.0  # the cost model's prediction of its wall time when it was sent
    ends_at: float = 0.0  # when it is predicted to be done (core/workers.Assignment.ends_at; 0: sent + predicted)

    def __post_init__(self) -> None:
        if not self.ends_at:
            object.__setattr__(self, "ends_at", self.sent_at + self.predicted_s)


def _running_work(a) -> RunningWork:
    """A new view of a core.workers.Assignment, kept on it (`WorkerView.of` builds one again only when
    its predicted end moved: the only field of it that changes, WorkerLink.reanchor)."""
    a.view = RunningWork(a.batch_id, tuple((e.request_id, e.slice_index) for e in a.entries), a.rows,
                         a.cost_rows, a.steps, a.label, a.forward_key, a.sent_at, a.predicted_s, a.ends_at)
    return a.view


@value
class WorkerView:
    worker_id: str
    rows: int  # the rows it may run at once: its capacity, capped by its predicted peak memory
    conditions_aside: bool
    running: tuple[RunningWork, ...]  # in the order they were sent (the worker admits them so)
    prefetch: int = 0  # batches' worth it may hold beyond what it runs (they wait on the worker)
    refuses: frozenset[str] = frozenset()  # forward labels it is sent none of (WorkerState.refused_labels)
    free_rows: int = field(init=False)  # rows free to run now
    spare: int = field(init=False)  # rows it may still be sent to hold, beyond free_rows
    forward_key: tuple | None = field(init=False)  # of its running rows; None when idle
    busy_until: float = field(init=False)  # when what it holds now is predicted to be done
    frees_at: float = field(init=False)  # when the first of what it holds is predicted to be done

    def __post_init__(self) -> None:
        # one pass over what it holds: a worker's view is rebuilt after every change to it, and under step
        # batching it holds an assignment per row and as many again prefetched
        used, first, last = 0, math.inf, -math.inf
        for a in self.running:
            used += a.rows
            ends = a.ends_at
            if ends < first:
                first = ends
            if ends > last:
                last = ends
        free = max(0, self.rows - used)
        put = object.__setattr__
        put(self, "free_rows", free)
        put(self, "spare", max(0, self.rows * (1 + self.prefetch) - used - free))
        put(self, "forward_key", self.running[0].forward_key if self.running else None)
        put(self, "busy_until", last if self.running else 0.0)
        put(self, "frees_at", first if self.running else 0.0)

    @classmethod
    def of(cls, w, rows: int, prefetch: int) -> WorkerView:
        """The view of a core.workers.WorkerState that may run `rows` rows at once now."""
        # each assignment's kept view, checked here rather than through a call per assignment (a step
        # worker holds a dozen, and its view is rebuilt after every result it sends)
        running = []
        for a in w.assignments.values():
            view = a.view
            running.append(view if view is not None and view.ends_at == a.ends_at else _running_work(a))
        return cls(w.worker_id, rows, w.conditions_aside, tuple(running), prefetch, w.refused_labels)

    def slot(self, spare: int | None = None) -> WorkerSlot:
        """For step batching: its free rows, and the spare rows it may hold for later (`spare` of them)."""
        return WorkerSlot(self.worker_id, self.rows, self.free_rows, self.forward_key,
                          self.spare if spare is None else spare, self.refuses)

    @property
    def takes_a_batch(self) -> bool:
        """For dispatch batching: idle, or running no more batches than it may hold besides."""
        return len(self.running) <= self.prefetch

    def open_to_work(self, dispatch: bool) -> bool:
        """core/workers.WorkerState.open_to_work, read from the view: it may be sent work now or once due."""
        return self.takes_a_batch if dispatch else self.free_rows + self.spare > 0

    def batch_slot(self) -> WorkerSlot:
        """For dispatch batching: a whole batch, run after what it runs now (forward_key: None when idle)."""
        return WorkerSlot(self.worker_id, self.rows, self.rows, self.forward_key, refuses=self.refuses)


@value
class GroupView:
    """A queued or running group, as the deadline rules see it."""

    request_id: str
    order: tuple  # (effective deadline, admission order): where its slices sit in the queue
    deadline: float | None
    min_count: int
    served_count: int
    startable: bool  # nothing of it has started: an elastic count may still shrink
    running: bool
    steps: int
    observations: int
    label: str
    forward_key: tuple
    batch_key: tuple
    sequential: bool = False  # admitted under the sequential policy: over a worker's rows, one candidate a slice

    @classmethod
    def of(cls, g, startable: bool, order: tuple | None = None, sequential: bool = False) -> GroupView:
        """The view of a core.group.Group (at `order`: one not queued yet)."""
        running = g.status.name == "RUNNING"
        return cls(g.request_id, order or g.order, g.deadline, g.spec.min_count, g.served_count, startable, running,
                   g.sampling.steps, g.request.observations, g.label, g.forward_key, g.batch_key, sequential)

    @property
    def elastic(self) -> bool:
        return self.deadline is not None and self.startable and self.min_count < self.served_count

    def units(self, count: int, capacity: int) -> list[Unit]:
        """Its work as if it served `count` candidates, sliced for `capacity` rows (as admission would:
        core/admission.decide)."""
        if self.sequential and count > capacity:
            slices = tuple((i,) for i in range(count))
        else:
            slices = split_balanced(count, capacity)
        return [Unit(self.request_id, i, ids, self.batch_key, self.forward_key, (*self.order, i), self.steps,
                     len(ids) * self.observations, self.label)
                for i, ids in enumerate(slices)]


@value
class PlanningSnapshot:
    now: float
    batching: str
    best_effort_s: float
    workers: tuple[WorkerView, ...]
    cost: CostModel
    calibrated: bool  # every live worker has a cost model: without one, nothing is forecast
    queue: PendingIndex
    group: Callable[[str], GroupView | None]
    # queued groups whose count may still shrink, with what they would give back (read through)
    elastic: ElasticIndex = field(default_factory=ElasticIndex)
    prefetch: int = 0  # batches' worth a worker may hold beyond what it runs
    prefetch_lead_s: float = math.inf  # how long before a worker needs it prefetched work is sent
    prefetch_margin: Mapping[str, float] = field(default_factory=dict)  # worker id -> extra lead (core/prefetch.py)
    stagger: bool = False  # dispatch: next starts spread the boundaries behind a deep backlog (core/stagger.py)
    # Staggered starts an earlier pass decided, still to come: kept, not decided again from a boundary
    # that has moved since (an idle worker's boundary is always now)
    decided: Mapping[str, float] = field(default_factory=dict)
    # The fluid forecast's sums over the workers (core/fleet_terms.py), which the engine keeps across
    # snapshots and mends for the workers that changed; None (or sums that follow other views): built
    # for this snapshot (`terms`)
    fleet: FleetTerms | None = None
    # Answers `open` (core/worker_views.WorkerViews.open keeps them; None: derived from `workers`)
    open_of: Callable[[], tuple[WorkerView, ...]] | None = None
    positions: Mapping[str, int] | None = None  # worker id -> its place in `workers` (None: found by a scan)
    # a group's own deadline by request id, read through (None: derived from `group`, which builds a view)
    deadlines: Callable[[str], float | None] | None = None
    # whether any live group may have a deadline (False: no batch can make one late, so none is guarded)
    any_deadline: bool = True

    def deadline_of(self, request_id: str) -> float | None:
        """The group's own deadline (None: it has none, or is not known here): what a batch may not break."""
        if self.deadlines is not None:
            return self.deadlines(request_id)
        view = self.group(request_id)
        return None if view is None else view.deadline

    @cached_property
    def open(self) -> tuple[WorkerView, ...]:
        """The workers that may be sent work, now or once due for it (dispatch: may take a batch; step: free
        or spare rows), in the workers' order: a pass looks at no other."""
        if self.open_of is not None:
            return self.open_of()
        dispatch = self.batching == "dispatch"
        return tuple(w for w in self.workers if w.open_to_work(dispatch))

    @property
    def planned_cost(self) -> Scaled:
        return Scaled(self.cost)

    @property
    def slice_capacity(self) -> int:
        """The rows admission sizes slices for: the smallest live worker's."""
        return self.terms.min_rows

    @cached_property
    def terms(self) -> FleetTerms:
        """The sums over the workers the fluid forecast reads: the engine's when they follow these views."""
        if self.fleet is not None and self.fleet.workers is self.workers and self.fleet.cost is self.cost:
            return self.fleet
        return FleetTerms(self.workers, self.cost)

    # ---- late prefetch: work that will wait on a worker is sent just in time, not as soon as there is room.
    # Until it is sent it stays in the queue, where a group that arrives meanwhile -- another tenant's,
    # or one with an earlier deadline -- can still go ahead of it. Sent at once, a held batch of one
    # tenant's flood stands between every later group and the worker for a whole batch.

    def lead_s(self, w: WorkerView) -> float:
        """How long before `w` is predicted to need its next work that work is sent: the link's allowance,
        the margin the worker has shown it needs (core/prefetch.py), plus conditioning it on the
        worker's side thread while the running batch ends (the next batch may be a different observation
        in every row)."""
        lead = self.prefetch_lead_s + self.prefetch_margin.get(w.worker_id, 0.0)
        if w.conditions_aside and w.running:
            lead += w.rows * self.cost.overhead_s(w.worker_id, w.running[0].label)
        return lead

    def prefetch_due_at(self, w: WorkerView) -> float | None:
        """When work that would wait on `w` may next be sent: `lead_s` before the batch it holds is
        predicted to end (dispatch), or before the next of its running assignments is predicted to end
        and free its rows (step). -inf: now -- without a prediction (no cost model yet) it goes at once,
        and an idle worker's first batch is no prefetch. None: not before what it runs changes (an idle
        worker's spare rows under step batching wait until what it is about to start has an end). A
        staggered start (dispatch, `starts`): when the batch must go for its first step to come then."""
        send = self._stagger[1].get(w.worker_id)
        if send is not None:
            return send
        if self.prefetch_lead_s == math.inf or not self.calibrated:
            return -math.inf
        if not w.running:
            return -math.inf if self.batching == "dispatch" else None
        lead = self.lead_s(w)
        if self.batching == "dispatch":
            return w.busy_until - lead
        later = [a.ends_at - lead for a in w.running if a.ends_at - lead > self.now]
        return min(later, default=-math.inf)

    def prefetch_due(self, w: WorkerView) -> bool:
        """Dispatch batching: whether `w` may be sent the batch it will hold next, now."""
        due = self.prefetch_due_at(w)
        return due is not None and due <= self.now

    @cached_property
    def _due_order(self):
        """The open workers in order of when work for them is due (core/fleet_terms.FleetTerms.due: under
        dispatch batching `prefetch_due_at` before any staggered start; under step batching when
        `spare_due` is first above 0), kept by the fleet terms and mended as workers change, so that who
        is due now, and when the next one is, costs the workers due rather than the fleet. None (not
        calibrated; step batching with every spare row sent at once): every open worker is asked."""
        if not self.calibrated:
            return None
        if self.batching == "dispatch":
            return self.terms.due("batch", self.lead_s)
        return None if self.prefetch_lead_s == math.inf else self.terms.due("rows", self.lead_s)

    def due_now(self) -> list[WorkerView]:
        """Dispatch batching: the open workers that may be sent their next batch now, in the workers' order.
        A staggered start only ever sends later than the worker's own due time (it waits past a boundary
        that was due), so the workers due before any stagger are the ones to look at."""
        return list(self._due_now)

    @cached_property
    def _due_now(self) -> tuple[WorkerView, ...]:  # a pass asks twice: room_now, then its slots
        order = self._due_order
        if order is None:
            return tuple(w for w in self.open if self.prefetch_due(w))
        sends, now = self._stagger[1], self.now
        due = (self.workers[i] for i in sorted(order.upto(now)))
        return tuple(w for w in due if sends.get(w.worker_id, now) <= now)

    def rows_due(self) -> list[tuple[WorkerView, int]]:
        """Step batching: the open workers with rows to fill now -- free ones, or spare ones due
        (`spare_due`) -- each with the spare rows it may be sent, in the workers' order."""
        return list(self._rows_due)

    @cached_property
    def _rows_due(self) -> tuple[tuple[WorkerView, int], ...]:  # a pass asks twice: room_now, then its slots
        order = self._due_order
        workers = self.open if order is None else [self.workers[i] for i in sorted(order.upto(self.now))]
        due = []
        for w in workers:
            spare = self.spare_due(w) if w.spare else 0  # none to give: no need to ask when (the common case)
            if w.free_rows + spare > 0:
                due.append((w, spare))
        return tuple(due)

    def spare_due(self, w: WorkerView) -> int:
        """Step batching: the spare rows `w` may be sent now -- as many as its running assignments
        predicted to end within the lead will free, less the rows it already holds beyond its capacity."""
        if self.prefetch_lead_s == math.inf or not self.calibrated:
            return w.spare
        if not w.running:
            return 0
        lead = self.lead_s(w)
        freeing = sum(a.rows for a in w.running if a.ends_at - lead <= self.now)
        held = max(0, sum(a.rows for a in w.running) - w.rows)
        return max(0, min(w.spare, freeing - held))

    def room_now(self) -> bool:
        """Whether a planning pass could send any worker anything now (else it places nothing, and fixes
        no elastic count either: that waits until a group could start)."""
        return bool(self.due_now() if self.batching == "dispatch" else self.rows_due())

    def wake_at(self) -> float | None:
        """The next instant a planning pass may place work that no pass can place now: the earliest time
        a worker with room for prefetched work becomes due for it (a staggered start's included). None: no
        event needs to come sooner."""
        if self._due_order is not None:
            if self.batching == "step":  # each running assignment's end less the lead, of the workers with spare rows
                return self.terms.due("ends", self.lead_s).first_above(self.now)
            # a staggered start's workers were due already: none of them is first above now
            due = [t for t in (self._due_order.first_above(self.now), *self._stagger[1].values())
                   if t is not None and t > self.now]
            return min(due, default=None)
        due = [t for w in self.open if self._has_room(w) for t in (self.prefetch_due_at(w),)
               if t is not None and t > self.now]
        return min(due, default=None)

    @property
    def starts(self) -> Mapping[str, float]:
        """Staggered starts (core/stagger.py): worker id -> when a worker due for its next batch starts it,
        for those that wait past their boundary."""
        return self._stagger[0]

    @cached_property
    def _stagger(self) -> tuple[Mapping[str, float], Mapping[str, float]]:
        """The staggered starts, and when each one's batch must be sent: its start less the conditioning
        a worker that conditions aside does before the first step (the lead of late prefetch is for work
        that waits on the worker; this work must not), never before its boundary, or it would start there.
        Dispatch batching only. Empty unless the backlog is deep, the cost model can time a batch, the
        workers take about as long for one (MIXED_FLEET), a batch over the workers is above the timing
        jitter, and the group at the head is best effort: a deadline's forecast counts on every worker
        starting at its boundary."""
        if (not self.stagger or self.batching != "dispatch" or len(self.workers) < 2 or not self.calibrated
                or not deep(self.queue.candidates, self.terms.total_rows)):
            return {}, {}
        # the workers deciding their next start (they have room), and due to: its boundary is now when
        # idle, else when what it holds is done -- less the lead (the due order: a worker told 0 rows
        # runs nothing). Asked first: most snapshots have none, and what follows reads the fleet.
        due = [(w.busy_until if w.running else self.now, i, w)
               for i in self._due_order.upto(self.now) for w in (self.workers[i],) if w.rows]
        if not due:
            return {}, {}
        head = self.queue.walk().first()
        view = None if head is None else self.group(head[1].request_id)
        if view is None or view.deadline is not None:
            return {}, {}
        kind = head[0]
        # a full batch of the head's kind, back to back, on each worker (kept by the fleet terms)
        period, shortest, longest, live = self.terms.periods(kind.label, kind.size, kind.cost_rows, kind.steps)
        if not live or mixed((shortest, longest)):
            return {}, {}  # a mixed fleet's boundaries drift apart by themselves: one period spaces none of them
        spacing = period / live
        if spacing < MIN_SPACING_S:
            return {}, {}
        # every running worker's boundary as a phase on the circle, by position (NaN: none); a worker's
        # entry moves to where its next batch will end once it has decided
        phases = (self.terms.ends() - self.now) % period
        starts, sends = {}, {}
        for boundary, i, w in sorted(due, key=lambda d: d[:2]):  # the earliest boundary decides first
            phase = (boundary - self.now) % period
            if w.worker_id in self.decided:
                wait = max(0.0, self.decided[w.worker_id] - boundary)
            else:
                others = np.delete(phases, i)
                others = np.sort((others[~np.isnan(others)] - phase) % period)
                spaced = spacing >= MIN_SPACING_S + self.prefetch_margin.get(w.worker_id, 0.0)
                wait = float(delay(period, live, others, balance=bool(w.running))) if spaced else 0.0
            phases[i] = (phase + wait) % period
            if wait > 0:
                starts[w.worker_id] = boundary + wait
                units = max(1, w.rows // kind.size)  # the groups it conditions before its first step
                before = units * self.cost.overhead_s(w.worker_id, kind.label) if w.conditions_aside else 0.0
                sends[w.worker_id] = max(boundary, boundary + wait - before)
        return starts, sends

    def _has_room(self, w: WorkerView) -> bool:
        return w.takes_a_batch if self.batching == "dispatch" else w.spare > 0

    def worker(self, worker_id: str) -> WorkerView:
        if self.positions is not None:
            return self.workers[self.positions[worker_id]]
        return self._by_id[worker_id]

    @cached_property
    def scratch(self) -> dict:
        """Answers that hold for this snapshot only (one decision, during which the engine does not change),
        kept by the rules that ask them more than once (core/fluid.Pipe.of); `terms` outlive it."""
        return {}

    @cached_property
    def _by_id(self) -> Mapping[str, WorkerView]:
        return {w.worker_id: w for w in self.workers}

    def sim_workers(self, only: str | None = None) -> list[SimWorker]:
        """Fresh simulated workers as they run now (core/forecast.py): for each assignment, the steps it
        has left are what its time so far bought at the rows running there now, at the pace the forecasts
        plan for (the worker's margin): the steps left are then run at that pace, and a worker running
        late by its margin is not taken to be further along than it is."""
        cost = self.planned_cost
        sims = []
        for w in self.workers if only is None else (self.worker(only),):
            sim = SimWorker(w.worker_id, w.rows, conditions_aside=w.conditions_aside, refuses=w.refuses)
            # what runs: the assignments that fit its rows, in the order sent (under dispatch batching the
            # first one alone: a batch runs on its own); the rest waits on the worker
            rows, running, held = 0, [], []
            for a in w.running:
                runs = not running or (self.batching == "step" and not held and rows + a.rows <= w.rows)
                (running if runs else held).append(a)
                rows += a.rows
            total_rows = sum(a.cost_rows for a in running)
            wait = 0.0
            for a in running:
                tau = cost.forward_s(w.worker_id, a.label, total_rows)
                fixed = cost.overhead_s(w.worker_id, a.label) * len(a.keys)
                done = (self.now - a.sent_at - fixed) / tau if tau > 0 else 0.0
                left = min(float(a.steps), max(0.5, a.steps - max(0.0, done)))
                # an assignment still being conditioned: on a worker that conditions aside it has not joined
                # yet; on one that conditions inline, the worker steps nothing until it is done
                conditioning = max(0.0, fixed - (self.now - a.sent_at))
                delay = conditioning if w.conditions_aside else 0.0
                if w.conditions_aside:
                    sim.preparing = max(sim.preparing, delay)
                else:
                    sim.stall = max(sim.stall, conditioning)
                sim.items.append(SimItem(a.keys, a.rows, a.cost_rows, left, a.label, a.forward_key, delay))
                wait = max(wait, conditioning + left * tau)
            for a in held:  # it starts once what runs before it is done (the longest of it, to be safe), and
                # is conditioned meanwhile on a side thread, else then (as the planner predicts it)
                fixed = cost.overhead_s(w.worker_id, a.label) * len(a.keys)
                start = max(wait, fixed) if w.conditions_aside else wait + fixed
                sim.items.append(SimItem(a.keys, a.rows, a.cost_rows, float(a.steps), a.label, a.forward_key, start))
            sims.append(sim)
        return sims
