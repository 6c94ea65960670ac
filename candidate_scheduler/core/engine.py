"""The scheduling engine: every decision the scheduler makes, with no IO.

Events go in -- a submission, a worker's registration, heartbeat, result or leaving, a control
request, and `tick(now)` -- and each call returns the messages to send (core/messages.py). The engine
owns all group, worker and assignment state; it never opens a socket, runs an event loop or reads a
clock: the shell (service/server.py) passes `now` in and sends what comes back, in order. That is
vLLM v1's split of `Scheduler` from `EngineCoreProc`, and why every rule here is tested in process, in
microseconds (tests/unit/test_engine.py).

The life of a group: `submit` validates it (core/request.py) and admits it (core/admission.py) once a
worker has said what the model supports; its pending slices enter the indexed queue (core/pending.py).
Each event ends with a planning pass: `schedule(now)` returns a `SchedulePlan` (core/schedule.py) and
changes nothing, `apply(plan)` starts the slices it places and makes the BATCH / JOIN messages.
`worker_result` classifies each slice's outcome (core/outcomes.py) and folds, retries or fails it; once
every candidate is in, the group is reduced and answered. A cancel, an expiry, a shutdown or exhausted
retries answer it instead, all through one door (core/endings.py). GroupState makes "answered exactly
once" and "never a partial aggregate" structural.

Atomic events. No event raises. When code inside one does -- admission, planning, a forecast, a
reducer, a metric -- the groups the failing step was working on (and only those) are answered once,
`failed` with `internal_error` naming the exception; the messages the event made before are kept (a
reply already made is never lost); the fault is counted and reported to the shell as an
`InternalFault` message, which logs it with its traceback.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import math
from typing import Any

from candidate_scheduler.core import deadlines, schedule
from candidate_scheduler.core.access import LOCAL, Action, Principal
from candidate_scheduler.core.admission import AdmissionPolicy
from candidate_scheduler.core.control import Control
from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.elastic_index import ElasticEntry, ElasticIndex
from candidate_scheduler.core.endings import INTERNAL_ERROR, Endings  # noqa: F401 - INTERNAL_ERROR re-exported
from candidate_scheduler.core.engine_config import EngineConfig  # noqa: F401 - re-exported (its users import it here)
from candidate_scheduler.core.faults import Faults
from candidate_scheduler.core.fleet_rows import FleetRows
from candidate_scheduler.core.fleet_terms import FleetTerms
from candidate_scheduler.core.group import Group, refusal
from candidate_scheduler.core.group_state import GroupStatus
from candidate_scheduler.core.guard import Guard
from candidate_scheduler.core.intake import Intake
from candidate_scheduler.core.messages import (
    ControlAnswer,
    GiveBack,
    Heartbeat,
    Leaving,
    Left,
    Registration,
    Reply,
    SendWork,
    SliceWork,
    WorkerResult,
)
from candidate_scheduler.core.no_metrics import NoMetrics
from candidate_scheduler.core.pending import PendingIndex
from candidate_scheduler.core.planning import Unit, dispatch_class, step_class
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.resubmission import ReplyCache
from candidate_scheduler.core.snapshot import GroupView, PlanningSnapshot
from candidate_scheduler.core.tenants import Tenants
from candidate_scheduler.core.worker_link import WorkerLink
from candidate_scheduler.core.worker_views import WorkerViews
from candidate_scheduler.core.workers import Assignment, WorkerState

_PLANNING_ATTEMPTS = 4  # planning passes per event when one raises on a group (which is then answered)


class Engine:
    def __init__(self, config: EngineConfig | None = None, metrics: Any | None = None, first_batch_id: int = 1,
                 stopwatch=None, reply_limit_bytes: int | None = None):
        self.config = config or EngineConfig()
        self.reply_limit_bytes = reply_limit_bytes  # what a reply's arrays may weigh: the shell's link (endings.py)
        self.metrics = metrics if metrics is not None else NoMetrics()
        self.groups: dict[str, Group] = {}
        self.waiting: collections.OrderedDict[str, None] = collections.OrderedDict()  # no worker yet
        self.pending = PendingIndex(dispatch_class if self.config.batching == "dispatch" else step_class)
        self.finished: collections.OrderedDict[str, str] = collections.OrderedDict()  # id -> final status
        self.scoped_ids = False  # whether ids carry principals' names: error texts are then redacted per group
        self.workers: dict[str, WorkerState] = {}
        # workers that said they are going: no new work, their assignments still answered (worker_link.py)
        self.leaving: dict[str, WorkerState] = {}
        self.assignments: dict[int, Assignment] = {}
        # Batch ids never repeat across restarts (the shell picks the first at random): else a worker
        # finishing a previous incarnation's batch would have its stale result taken.
        self.next_batch = first_batch_id
        self.draining = False
        self.stopping = False  # draining because the scheduler is going away: refusals say `stopping`
        self.counters: collections.Counter = collections.Counter()
        self.cost = CostModel(self.config.margin_quantile)
        # No pending slice is larger: the largest worker's rows when pending slices were last fitted to it,
        # raised by every slice queued since (Engine._fit_slices halves them when the largest shrinks below)
        self._largest_fitted = 0
        self._refused_failed: frozenset[str] = frozenset()  # forward labels whose groups _fit_slices has failed
        self._taking_fitted: dict[str, int] = {}  # FleetRows.largest_taking when pending slices were last fitted
        self._held_in_pass: dict[str, float] = {}  # staggered starts the last planning pass decided
        self.cache_bytes: dict[str, int] = {}  # worker id -> its conditioning cache's bytes in use
        self.elastic = ElasticIndex()  # queued groups with a deadline whose count may still shrink
        self.unstarted: set[str] = set()  # admitted groups none of whose slices has started
        self._known_cost: set[str] = set()  # workers whose cost model is calibrated
        self._calibrated_in: int | None = None  # the rows epoch in which every live worker was known calibrated
        self.fleet_rows = FleetRows(self.rows_of)  # what the live workers may hold, and admission by it
        self.views = WorkerViews(self.config.batching)  # the workers' planning views, rebuilt as they go stale
        self.fleet = FleetTerms((), self.cost)  # the fluid forecast's sums over the workers, mended as they change
        # When the shell should run a planning pass though nothing happened: a worker becomes due for the
        # work it will hold next (late prefetch), or for its staggered start. None: the next event is soon enough.
        self.wake_at: float | None = None
        # worker id -> the staggered start a pass decided for it, still to come: kept by later passes, and
        # the worker, idle meanwhile, is not starved
        self.held_back: dict[str, float] = {}
        self.prefetch_margin: dict[str, float] = {}  # worker id -> extra lead it has shown it needs (core/prefetch.py)
        self.held: dict[str, set[int]] = {}  # request id -> the assignments running its slices
        # (deadline, serial, request id): a heap; the serial tells a group from a later one with its id
        self.expiries: list[tuple[float, int, str]] = []
        self.serial = 0
        self._admitted = 0  # admission order: the tiebreak of equal effective deadlines
        # A real stopwatch the shell injects for work inside an event (the reducer); the core reads no clock.
        self.stopwatch = stopwatch
        self.outbox: list = []  # the messages of the event being handled
        self.link = WorkerLink(self)
        self.control = Control(self)
        self.intake = Intake(self)
        self.endings = Endings(self)
        self.faults = Faults(self)
        self.tenants = Tenants(self.config.tenants, fair=self.config.fair_queueing, remember=self.config.finished_memory)
        self.replies = ReplyCache(self.config.replies_kept, self.config.replies_kept_bytes)  # for resubmissions
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    # ---- atomic events ----------------------------------------------------------------------------------

    def _event(self, name: str, now: float, body, *args, plan: bool = True) -> list:
        """Run one event; then, with `plan`, the planning pass (the shell that handles a burst of messages
        passes plan=False for each and calls `plan` once after the burst)."""
        self.now = now
        self.outbox = []
        with self.guard(name):
            body(*args)
        if plan:
            self.plan_and_apply()
            self.wake_at = self._wake_at()
        out, self.outbox = self.outbox, []
        return out

    def plan(self, now: float) -> list:
        """A planning pass on its own: what the shell runs after a burst of events it did not plan after."""
        return self._event("schedule", now, lambda: None)

    def guard(self, event: str, *request_ids: str) -> Guard:
        """Run a step of `event`; if it raises, answer `request_ids` (the groups it was working on) with
        an internal error, report the fault, and go on."""
        return Guard(self.report_fault, event, request_ids)

    def report_fault(self, event: str, exc: BaseException, request_ids=(), answered=()) -> None:
        """An exception inside an event: counted, logged, and `request_ids` answered (core/faults.py)."""
        self.faults.report(event, exc, request_ids, answered)

    # ---- submissions ------------------------------------------------------------------------------------

    def submit(self, client: Any, sub: Submission, now: float, *, plan: bool = True,
               principal: Principal = LOCAL, via: str | None = None, fingerprint: bytes | None = None) -> list:
        """A new group from `principal` (sent by `via`, a proxy acting for it, when not None);
        `fingerprint`: of the request's bytes, which a resubmission under its id must match."""
        self.now = now
        self.outbox = []
        stored: list[Group] = []
        owners = (principal.name,) if via is None else (principal.name, via)
        try:
            self.intake.submit(client, sub, principal, owners, stored, fingerprint)
        except Exception as exc:  # noqa: BLE001
            if stored:
                self.report_fault("submit", exc, (stored[0].request_id,))
            else:  # it raised before the group was kept: answer the submission itself
                self.report_fault("submit", exc, ())
                if not self._answered(client, sub.scoped_id):  # counted as any refusal is
                    with contextlib.suppress(Exception):
                        self.metrics.group_completed("failed", 0.0)
                        self.metrics.tenant_group(principal.tenant, "failed", 0)  # as every refusal is
                    self.outbox.append(Reply(client, refusal(sub.request_id, "failed", INTERNAL_ERROR,
                                                           f"internal error while handling submit: {exc!r}")))
        if plan:
            self.plan_and_apply()
            self.wake_at = self._wake_at()
        out, self.outbox = self.outbox, []
        return out

    def _answered(self, client: Any, request_id: Any) -> bool:
        """Whether `client` has its answer to a submission already: in this event's messages, or to come
        with the group in flight under that id (its sender, or a resubmission made one of its waiters
        before the event raised) -- a refusal too would be a second answer, and a wrong one."""
        if any(isinstance(m, Reply) and m.client is client for m in self.outbox):
            return True
        g = self.groups.get(request_id) if isinstance(request_id, str) else None
        return g is not None and not g.reply_taken and (client == g.client or client in g.waiters)

    def refuse(self, client: Any, request_id: str, status: str, code: str, message: str,
               field: str | None = None, tenant: str | None = None) -> list:
        """Answer a group that is not admitted (the shell calls this too, for undecodable contents);
        `tenant`: of the principal that sent it, whose answers are counted per tenant, refusals included."""
        out: list = [Reply(client, refusal(request_id, status, code, message, field))]
        try:
            self.metrics.group_completed(status, 0.0)
            if tenant is not None:
                self.metrics.tenant_group(tenant, status, 0)
        except Exception as exc:  # noqa: BLE001 - the answer goes all the same; the fault is reported beside it
            out.append(self.faults.message("refuse", exc, (request_id,)))
        return out

    def rows_changed(self) -> None:
        """A worker came or went, or the rows one may hold changed (capacity, memory): sizes are stale."""
        self.fleet_rows.changed()

    def order_of(self, g: Group) -> tuple:
        since = g.received_at + g.fair_lead_s  # core/fair_queue.py: behind its own tenant's backlog
        return (deadlines.effective_deadline(g.deadline, since, self.config.best_effort_s), self._admitted)

    def admit(self, group: Group) -> None:
        rows = self.fleet_rows.current(self.workers)  # brings every worker's rows up to date
        decision = rows.decide(group.spec, group.sampling.action_mode, group.label, self.config.policy)
        self.metrics.admission(decision.mode.value, decision.reason)
        if group.admit(decision):
            if group.deadline is None:
                work = group.spec.count * group.sampling.steps * group.request.observations
                group.fair_tag, group.fair_lead_s = self.tenants.stamp(group.tenant, work)
            group.order = self.order_of(group)
            self._admitted += 1
            self.unstarted.add(group.request_id)
            self._enqueue(group)
            self.metrics.microbatches_per_group(len(decision.slices))
        else:
            self.end(group)

    # ---- the queue ---------------------------------------------------------------------------------------

    def _unit(self, g: Group, slice_index: int, ids: tuple[int, ...]) -> Unit:
        return Unit(g.request_id, slice_index, ids, g.batch_key, g.forward_key, (*g.order, slice_index),
                    g.sampling.steps, len(ids) * g.request.observations, g.label,
                    wire_bytes=g.request.wire_bytes(len(ids)))

    def _enqueue(self, g: Group) -> None:
        """Index every pending slice of the group (after admission or a change of its slices)."""
        self.pending.discard_group(g.request_id)
        slices = g.pending_slices()
        for i, ids in slices:
            self.pending.add(self._unit(g, i, ids))
            # sized for the fleet at admission: if the workers it fits go before a pass fits it, the next one
            # must see it (a burst admits with no pass, and its worker may leave in it)
            self._largest_fitted = max(self._largest_fitted, len(ids))
        if g.deadline is not None and g.spec.min_count < g.served_count and g.request_id in self.unstarted:
            extra = (g.served_count - g.spec.min_count) * g.request.observations * g.sampling.steps
            self.elastic.put(ElasticEntry(g.request_id, g.order, g.label, extra, len(slices), g.spec.min_count))
        else:
            self.elastic.discard(g.request_id)

    def requeue(self, g: Group, slice_index: int) -> None:
        """A slice that went back to pending (a retry); halved first if no live worker can hold it any
        more (it was running when the largest one shrank)."""
        # running when the pass failed its shape's pending groups (no live worker takes it): the next one fails it
        self._refused_failed -= {g.label}
        largest = self.fleet_rows.current(self.workers).largest_for(g.label) if self.workers else 0
        if self.workers and len(g.slices[slice_index]) > largest:
            g.fit_pending(largest)
            self._enqueue(g)
        else:  # with no live worker, the next one's pass splits it if it must (_fit_slices)
            self._largest_fitted = max(self._largest_fitted, len(g.slices[slice_index]))
            self.pending.add(self._unit(g, slice_index, g.slices[slice_index]))

    # ---- planning ------------------------------------------------------------------------------------------

    def snapshot(self, now: float) -> PlanningSnapshot:
        """What a planning decision may read (core/snapshot.py), as the engine stands now."""
        views = self.views.current(self.workers, self.fleet_rows.current(self.workers).epoch, self.config.prefetch)
        self.fleet = self.fleet.follow(views, self.views.changes, self.views.positions)
        return PlanningSnapshot(now, self.config.batching, self.config.best_effort_s, views, self.cost,
                                self._calibrated(), self.pending, self._group_view,
                                self.elastic, self.config.prefetch, self.config.prefetch_lead_s, self.prefetch_margin,
                                self.config.stagger, self.held_back, fleet=self.fleet, open_of=self.views.open,
                                positions=self.views.positions, deadlines=self._deadline_of,
                                any_deadline=bool(self.expiries))

    def forget_cost(self, worker_id: str) -> None:
        self._known_cost.discard(worker_id)
        self._calibrated_in = None

    def _calibrated(self) -> bool:
        """Every live worker has a cost model (once it has one, it keeps it until it is forgotten; the live
        workers change only with the rows epoch, so the answer holds until then: every snapshot asks)."""
        if self._calibrated_in == self.fleet_rows.epoch:
            return True
        for wid in self.workers:
            if wid not in self._known_cost:
                if not self.cost.calibrated(wid):
                    return False
                self._known_cost.add(wid)
        self._calibrated_in = self.fleet_rows.epoch
        return True

    def schedule(self, now: float, *, elastic: bool = True,
                 trace: schedule.Trace | None = None) -> schedule.SchedulePlan:
        """The next planning pass as a value (core/schedule.py); nothing changes until `apply`."""
        return schedule.plan(self.snapshot(now), elastic=elastic, trace=trace)

    def _schedule_pass(self, *, elastic: bool, trace: schedule.Trace) -> schedule.SchedulePlan:
        """`schedule` for the engine's own pass, which keeps the staggered starts it decided (`_wake_at`)."""
        snap = self.snapshot(self.now)
        plan = schedule.plan(snap, elastic=elastic, trace=trace)
        self._held_in_pass = dict(snap.starts)
        return plan

    def apply(self, plan: schedule.SchedulePlan, now: float | None = None) -> list:
        """Carry out a plan: fix the counts it resizes, start the slices it places; the messages to send."""
        out = self._event("schedule", self.now if now is None else now, self._apply, plan, plan=False)
        self.wake_at = self._wake_at()
        return out

    def _apply(self, plan: schedule.SchedulePlan) -> None:
        for r in plan.resizes:
            with self.guard("schedule", r.request_id):
                self._resize(r)
        for p in plan.placements:
            with self.guard("schedule", *(u.request_id for u in p.units)):
                self._start(p)

    def plan_and_apply(self) -> None:
        """The planning pass that ends every event: plan, apply, and plan once more after resizes. A pass
        that raises fails the group it was deciding about and runs again without it (a few times at most:
        a fault it cannot pin on a group rebuilds the fleet's rows and views once, then waits for the next
        event)."""
        rebuilt = False
        for _attempt in range(_PLANNING_ATTEMPTS):
            trace = schedule.Trace()
            try:
                # inside the try: a fault in the check escaped the event and took its replies with it
                if not len(self.pending) or not self.workers or not self._can_place():
                    return
                self._fit_slices()
                plan = self._schedule_pass(elastic=True, trace=trace)
                if plan.resizes:
                    self._apply(plan)
                    plan = self._schedule_pass(elastic=False, trace=trace)
                self._apply(plan)
                return
            except Exception as exc:  # noqa: BLE001 - blame the group the pass was deciding about
                self.report_fault("schedule", exc, (trace.request_id,) if trace.request_id else ())
                if trace.request_id is None:
                    if rebuilt:
                        return
                    # a fault it cannot pin on a group may be state derived from the workers gone stale (the
                    # rows of a worker that left, still counted): rebuilt from them, the pass is tried again
                    rebuilt = True
                    with contextlib.suppress(Exception):
                        self.rows_changed()

    def _wake_at(self) -> float | None:
        """When the shell must plan next with nothing happening (a timed send or start), and which workers a
        staggered start keeps idle meanwhile (`held_back`, which the next snapshots keep as decided)."""
        held = self.held_back
        staggered = self.config.stagger and self.config.batching == "dispatch"
        if (staggered or self.config.prefetch and self.config.prefetch_lead_s < math.inf) and self.workers \
                and len(self.pending):
            with self.guard("schedule"):  # if it raises, the fault is reported and the next event plans
                snap = self.snapshot(self.now)
                self.held_back = {w: t for w, t in snap.starts.items() if t > self.now}
                if started_waiting := len(self.held_back.keys() - held.keys()):
                    self.counters["staggered_starts"] += started_waiting
                    self.metrics.staggered_starts(started_waiting)
                # a worker the pass kept idle for a start this snapshot no longer staggers (the backlog fell
                # below deep as the pass placed work) is due now: plan again now, not at the next event
                released = self._held_in_pass.keys() - self.held_back.keys()
                self._held_in_pass = {}
                return self.now if released else snap.wake_at()
        self.held_back = {}
        return None

    def _can_place(self) -> bool:
        """Some worker may be sent work, now or when it is due for it (core/worker_views.py keeps which)."""
        return self.views.any_open(self.workers, self.fleet_rows.current(self.workers).epoch, self.config.prefetch)

    def _fit_slices(self) -> None:
        """Halve pending slices no live worker can hold (the largest shrank after running out of memory,
        or the workers big enough left), so nothing waits forever for rows that will not come. Admission
        sizes new slices for the smallest worker, so only a shrink of the largest calls for a pass -- for a
        shape some workers refuse, of the largest that takes it. A group of a forward shape every live worker
        refuses now (core/fleet_rows.py) fails for the same reason."""
        rows = self.fleet_rows.current(self.workers)
        refused = rows.refused_everywhere - self._refused_failed
        if rows.largest < self._largest_fitted or refused or rows.largest_taking != self._taking_fitted:
            for g in list(self.groups.values()):
                # a fault here is this group's (its slices may be half re-indexed): it is answered, the rest fitted
                with self.guard("schedule", g.request_id):
                    if g.label in refused and g.pending_slices():
                        g.fail("out_of_memory", f"one candidate of forward {g.label} ran every live worker out of "
                                                "memory", field="count")
                        self.end(g)
                    elif g.fit_pending(rows.largest_for(g.label)):
                        self._enqueue(g)
        self._largest_fitted, self._refused_failed = rows.largest, rows.refused_everywhere
        self._taking_fitted = rows.largest_taking

    def _resize(self, r: schedule.Resize) -> None:
        g = self.groups.get(r.request_id)
        if g is None or g.status is not GroupStatus.ADMITTED or r.request_id not in self.unstarted:
            return
        rows = self.fleet_rows.current(self.workers)
        decision = rows.decide(deadlines.served_spec(g.spec, r.count), g.sampling.action_mode, g.label,
                               self.config.policy)
        if not decision.admitted:
            return  # --policy reject after an out-of-memory shrink: keep the count it was admitted with
        g.serve_first(r.count, decision)
        self._enqueue(g)

    def _start(self, p: schedule.Placement) -> None:
        worker = self.workers.get(p.worker_id)
        units = [u for u in p.units if self._pending_now(u)]
        if worker is None or not units:
            return  # a plan made before the engine changed: what it no longer fits is planned again
        if len(units) < len(p.units):
            p = dataclasses.replace(p, units=tuple(units))
        batch_id = self.next_batch
        self.next_batch += 1
        # a dispatch batch sent to a busy worker (prefetch) is a BATCH: it runs after the current one
        join = self.config.batching == "step" and not worker.idle
        shared = join or len({u.request_id for u in p.units}) > 1
        slices = []
        for u in p.units:
            g = self.groups[u.request_id]
            dispatch = g.start_slice(u.slice_index, worker.worker_id)
            self.pending.discard(u.request_id, u.slice_index)
            self.endings.leaves_queue(g, started=True)
            self.elastic.discard(u.request_id)  # started: its count is fixed
            self.held.setdefault(u.request_id, set()).add(batch_id)
            if g.physical_batches == 0:
                self.metrics.queue_wait(self.now - g.received_at)
                self.metrics.tenant_queue_wait(g.tenant, self.now - g.received_at)
            g.physical_batches += 1
            g.co_batched += int(shared)
            g.joins += int(join)
            slices.append(SliceWork(g, dispatch))
        first = p.units[0]
        a = Assignment(batch_id, worker.worker_id, tuple(u.entry for u in p.units), first.forward_key, self.now, join,
                       first.label, predicted_s=p.predicted_s, steps=max(u.steps for u in p.units),
                       cost_rows=sum(u.cost_rows for u in p.units), run_s=p.run_s)
        worker.hold(a)
        self.assignments[batch_id] = a
        told = worker.rows if worker.rows < worker.registered_rows else 0
        self.outbox.append(SendWork(worker.identity, batch_id, tuple(slices), join, told))
        self.metrics.physical_batch(a.rows, worker.capacity)
        if join:
            self.metrics.group_joined(len(p.units))

    def _pending_now(self, u) -> bool:
        # a plan's units are the index's own objects: one that was started, retried or re-sliced since is not
        return self.pending.get(u.request_id, u.slice_index) is u

    def rows_of(self, w: WorkerState) -> int:
        """The rows a worker may hold: its capacity, capped by its predicted peak memory (CUDA)."""
        return self.cost.workers[w.worker_id].max_rows_for(w.memory_budget_bytes, w.capacity) \
            if w.worker_id in self.cost.workers else w.capacity

    def _deadline_of(self, rid: str) -> float | None:
        g = self.groups.get(rid)
        return None if g is None else g.deadline

    def _group_view(self, rid: str) -> GroupView | None:
        g = self.groups.get(rid)
        return None if g is None else self.group_view(g)

    def group_view(self, g: Group, order: tuple | None = None) -> GroupView:
        return GroupView.of(g, g.request_id in self.unstarted or g.status is GroupStatus.QUEUED, order,
                            self.config.policy is AdmissionPolicy.SEQUENTIAL)

    # ---- the worker link (core/worker_link.py) ----------------------------------------------------------

    def register(self, identity: Any, reg: Registration, now: float) -> list:
        return self._event("register", now, self.link.register, identity, reg)

    def heartbeat(self, identity: Any, beat: Heartbeat, now: float, *, plan: bool = True) -> list:
        return self._event("heartbeat", now, self.link.heartbeat, identity, beat, plan=plan)

    def worker_result(self, identity: Any, result: WorkerResult, now: float, *, plan: bool = True) -> list:
        return self._event("result", now, self.link.result, identity, result, plan=plan)

    def worker_leaving(self, identity: Any, msg: Leaving, now: float, *, plan: bool = True) -> list:
        return self._event("leaving", now, self.link.leaving, identity, msg, plan=plan)

    def worker_left(self, identity: Any, msg: Left, now: float, *, plan: bool = True) -> list:
        return self._event("left", now, self.link.left, identity, msg, plan=plan)

    def worker_gave_back(self, identity: Any, msg: GiveBack, now: float, *, plan: bool = True) -> list:
        return self._event("give_back", now, self.link.gave_back, identity, msg, plan=plan)

    def worker_of(self, worker_id: str) -> WorkerState | None:
        """A live or leaving worker: either may hold assignments."""
        return self.workers.get(worker_id) or self.leaving.get(worker_id)

    # ---- endings ------------------------------------------------------------------------------------------

    def end(self, g: Group) -> None:
        """Send the group's one reply and forget it (core/endings.py)."""
        self.endings.end(g)

    def tick(self, now: float) -> list:
        """Deadlines, heartbeat timeouts, gauges, and planning: called by the shell a few times a second."""
        return self._event("tick", now, self._tick)

    def _tick(self) -> None:
        now = self.now
        while self.expiries and self.expiries[0][0] <= now:
            _deadline, serial, rid = heapq.heappop(self.expiries)
            g = self.groups.get(rid)
            if g is not None and g.serial == serial:
                with self.guard("tick", rid):
                    if g.expire(now):
                        self.end(g)
        for w in [*self.workers.values(), *self.leaving.values()]:
            if now - w.last_seen > self.config.heartbeat_timeout_s:
                with self.guard("tick"):  # one worker's fault leaves the others' timeouts to be judged
                    self.link.lost(w, "heartbeat_timeout", "tick")
        self.metrics.queue_depth(self.queued_groups(), self.queued_candidates())
        self.link.publish_due_margins()
        self.metrics.live_workers(len(self.workers))
        self.metrics.leaving_workers(len(self.leaving))
        self.metrics.drain_state(self.draining)

    # ---- control (core/control.py) ---------------------------------------------------------------------

    def shutdown(self, now: float) -> list:
        """Answer every group in flight (`shutting_down`) and tell leaving workers to go (the others find
        the next run on the same address by their heartbeats: core/control.py)."""
        return self._event("shutdown", now, self.control.shutdown, plan=False)

    def cancel(self, request_id: str, now: float, principal: Principal = LOCAL) -> tuple[ControlAnswer, list]:
        """Idempotent; says what it changed and in which state it found the group."""
        refused = self.control.forbidden(principal, Action.CANCEL, request_id)
        if refused is not None:
            return refused, []
        answer: list[ControlAnswer] = []
        out = self._event("cancel", now, self.control.cancel, request_id, answer)
        return (answer[0] if answer else ControlAnswer(ok=False, error="internal error; see the scheduler log")), out

    def worker_leave(self, worker_id: str, now: float) -> tuple[ControlAnswer, list]:
        """An operator's: the worker leaves as on SIGTERM (core/worker_link.py, "Leaving")."""
        answer: list[ControlAnswer] = []
        out = self._event("worker_leave", now, self.control.worker_leave, worker_id, answer)
        return (answer[0] if answer else ControlAnswer(ok=False, error="internal error; see the scheduler log")), out

    def status(self, request_id: str, principal: Principal = LOCAL) -> ControlAnswer:
        return self.control.forbidden(principal, Action.STATUS, request_id) or self.control.status(request_id)

    def drain(self) -> ControlAnswer:
        return self.control.drain()

    def stats(self) -> dict:
        return self.control.stats()

    def queued_groups(self) -> int:
        return len(self.waiting) + len(self.unstarted)  # admitted or waiting for a worker, not started

    def queued_candidates(self) -> int:
        # a group waiting for a first worker has no slices yet, but its candidates wait as queued_groups says
        # it does: without them the gauge read 0 beside a full queue whenever no worker was up
        return self.pending.candidates + sum(self.groups[rid].spec.count for rid in self.waiting if rid in self.groups)
