"""The scheduling engine: every decision the scheduler makes, with no IO.

Events go in -- a submission, a worker's registration, heartbeat or result, a control request, and
`tick(now)` -- and each call returns the messages to send (core/messages.py). The engine owns all group,
worker and assignment state; it never opens a socket, runs an event loop or reads a clock: the shell
(service/server.py) passes `now` in and sends what comes back, in order. That is vLLM v1's split of
`Scheduler` from `EngineCoreProc`, and why every rule here is tested in process, in microseconds
(tests/unit/test_engine.py).

The life of a group: `submit` validates it (core/request.py) and admits it (core/admission.py) once a
worker has said what the model supports; planning (core/planning.py) sends its slices to workers;
`worker_result` folds each slice (core/group.py) and, once every candidate is in, reduces it and answers
it; a cancel, an expiry, a shutdown or exhausted retries answer it instead. GroupState makes "answered
exactly once" and "never a partial aggregate" structural.

Failure taxonomy. Retried from the candidates' snapshots (up to `retry_limit` attempts per slice): a
worker that died, stopped heartbeating, lost a result on the link, sent a malformed result, or
reported a transient fault. Answered at once: an exception inside the model (`model_error`) and a
request the model cannot run (its own codes) -- no retry can fix either.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from candidate_scheduler.core import deadlines
from candidate_scheduler.core.admission import AdmissionPolicy, decide
from candidate_scheduler.core.cost_model import CostModel, check_margin_quantile
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.forecast import duration as forecast_duration
from candidate_scheduler.core.group import Group, refusal
from candidate_scheduler.core.group_state import GroupStatus
from candidate_scheduler.core.messages import (
    AckRegistration,
    CancelRows,
    ControlAnswer,
    Heartbeat,
    Registration,
    Reply,
    SendWork,
    SliceWork,
    StopWorker,
    WorkerResult,
)
from candidate_scheduler.core.planning import Unit, WorkerSlot, plan_dispatch, plan_step
from candidate_scheduler.core.request import Submission, check_request_id, validate
from candidate_scheduler.core.spec import ModelCapability
from candidate_scheduler.core.workers import Assignment, WorkerState

BATCHING_MODES = ("dispatch", "step")
# Worker error codes a retry from snapshots can fix; every other error code ends the group at once.
RETRYABLE_ERRORS = frozenset({"worker_error"})
_ELASTIC_LOOKAHEAD = 4  # waiting elastic groups per worker whose count is reconsidered at each planning


@dataclass
class EngineConfig:
    policy: AdmissionPolicy = AdmissionPolicy.MICROBATCH
    batching: str = "dispatch"
    max_queued_groups: int = 1024
    retry_limit: int = 3  # attempts per slice, the first one included
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 3.0
    finished_memory: int = 10_000  # finished groups remembered for STATUS
    best_effort_s: float = 30.0  # a group without a deadline is ordered as if due this long after receipt
    margin_quantile: float = 0.9  # of the measured prediction error that deadline forecasts plan for

    def __post_init__(self) -> None:
        self.policy = AdmissionPolicy(self.policy)
        check_margin_quantile(self.margin_quantile)
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")


class _NoMetrics:
    """The default metrics sink: every call is a no-op (tests that do not look at metrics)."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


class Engine:
    def __init__(self, config: EngineConfig | None = None, metrics: Any | None = None, first_batch_id: int = 1):
        self.config = config or EngineConfig()
        self.metrics = metrics if metrics is not None else _NoMetrics()
        self.groups: dict[str, Group] = {}
        self.queue: collections.OrderedDict[str, None] = collections.OrderedDict()  # admitted, not finished
        self.waiting: collections.OrderedDict[str, None] = collections.OrderedDict()  # no worker yet
        self.finished: collections.OrderedDict[str, str] = collections.OrderedDict()  # id -> final status
        self.workers: dict[str, WorkerState] = {}
        self.assignments: dict[int, Assignment] = {}
        # Batch ids must not repeat across scheduler restarts (the shell starts them at a random number):
        # a worker still finishing a batch of a previous incarnation would have its stale result taken.
        self._next_batch = first_batch_id
        self.draining = False
        self.counters: collections.Counter = collections.Counter()
        self.cost = CostModel(self.config.margin_quantile)
        self._largest_fitted = 0  # the largest worker's rows when pending slices were last fitted to it
        self.cache_bytes: dict[str, int] = {}  # worker id -> its conditioning cache's bytes in use
        self.elastic: set[str] = set()  # queued groups with a deadline whose count may still shrink
        self.now = 0.0

    def _clock(self) -> float:
        return self.now

    # ---- submissions ------------------------------------------------------------------------------------

    def submit(self, client: Any, sub: Submission, now: float) -> list:
        self.now = now
        self.metrics.group_received()
        rid = sub.request_id
        try:
            check_request_id(rid)
        except CandidateContractError as exc:
            return self.refuse(client, rid, "invalid", exc.code, exc.detail, "request_id")
        if rid in self.groups:
            return self.refuse(client, rid, "invalid", "duplicate_request_id", f"request {rid!r} is already in flight",
                               "request_id")
        if self.draining:
            return self.refuse(client, rid, "rejected", "draining", "the scheduler is draining and admits no new groups")
        if len(self.groups) >= self.config.max_queued_groups:
            return self.refuse(client, rid, "overloaded", "overloaded",
                               f"{len(self.groups)} groups in flight; try again later")
        try:
            request = validate(sub)
            group = Group(request, client, now, self._clock)  # derives the seeds: a bad base seed raises here
        except CandidateContractError as exc:
            return self.refuse(client, rid, "invalid", exc.code, str(exc), exc.field)
        except (ValueError, TypeError) as exc:
            return self.refuse(client, rid, "invalid", getattr(exc, "kind", "bad_request"), str(exc))
        self.groups[rid] = group
        self.metrics.candidates_per_group(request.spec.count)
        out: list = []
        if not self.workers:
            self.waiting[rid] = None  # admitted as soon as a worker registers
        elif (predicted := deadlines.refuse_at_receipt(self, group, now)) is not None:
            self.metrics.deadline_refusal()
            group.fail("deadline_unmeetable",
                       f"predicted completion in {predicted - now:.3f} s (at {request.spec.min_count} candidates) "
                       f"misses the deadline of {request.deadline_s:.3f} s", field="deadline_s")
            self._end(group, out)
            return out
        else:
            self._admit(group, out)
        self._schedule(out)
        return out

    def refuse(self, client: Any, request_id: str, status: str, code: str, message: str,
               field: str | None = None) -> list:
        """Answer a group that is not admitted (the shell calls this too, for undecodable contents)."""
        self.metrics.group_completed(status, 0.0)
        return [Reply(client, refusal(request_id, status, code, message, field))]

    def _capability(self) -> tuple[ModelCapability, int]:
        # Slices sized for the smallest live worker run anywhere; a larger worker co-batches them.
        live = list(self.workers.values())
        return live[0].capability, min(self.rows_of(w) for w in live)

    def _admit(self, group: Group, out: list) -> None:
        capability, capacity = self._capability()
        decision = decide(group.spec, capability, action_mode=group.sampling.action_mode,
                          policy=self.config.policy, batch_capacity=capacity)
        self.metrics.admission(decision.mode.value, decision.reason)
        if group.admit(decision):
            self.queue[group.request_id] = None
            if group.deadline is not None and group.spec.min_count < group.served_count:
                self.elastic.add(group.request_id)
            self.metrics.microbatches_per_group(len(decision.slices))
        else:
            self._end(group, out)

    # ---- planning and dispatch ------------------------------------------------------------------------

    def _units(self) -> list[Unit]:
        units = []
        for g in deadlines.order([self.groups[rid] for rid in self.queue], self.config.best_effort_s):
            fkey = g.sampling.forward_key()
            bkey = g.sampling.batch_key()
            for slice_index, ids in g.pending_slices():
                units.append(Unit(g.request_id, slice_index, ids, bkey, fkey))
        return units

    def _schedule(self, out: list) -> None:
        if not self.queue or not self.workers:
            return
        self._fit_slices()
        placements = self._plan()
        if self._shrink_starting(placements):
            placements = self._plan()  # smaller slices: plan again with the counts now fixed
        for worker_id, entries in placements:
            self._send(self.workers[worker_id], entries, out)

    def _fit_slices(self) -> None:
        """Halve pending slices no live worker can hold (the largest shrank after running out of memory,
        or the workers big enough left), so nothing waits forever for rows that will not come. Admission
        sizes new slices for the smallest worker, so only a shrink of the largest calls for a pass."""
        largest = max(self.rows_of(w) for w in self.workers.values())
        if largest >= self._largest_fitted:
            self._largest_fitted = largest
            return
        self._largest_fitted = largest
        for rid in self.queue:
            g = self.groups[rid]
            todo = [i for i, ids in g.pending_slices() if len(ids) > largest]
            while todo:
                i = todo.pop()
                if len(g.slices[i]) > largest:
                    todo += [i, g.split_slice(i)]

    def _plan(self) -> list[tuple[str, tuple]]:
        if self.config.batching == "dispatch":
            idle = [self._slot(w) for w in self.workers.values() if w.idle]
            if not idle:
                return []  # the common case under load: every worker busy, nothing to plan
            return [(wid, batch.entries) for wid, batch in plan_dispatch(self._units(), idle)]
        slots = [s for s in (self._slot(w) for w in self.workers.values()) if s.free_rows > 0]
        if not slots:
            return []
        return [(wid, (unit.entry,)) for wid, unit in plan_step(self._units(), slots, deadlines.backfiller(self, self.now))]

    def _shrink_starting(self, placements) -> bool:
        """Elastic counts: fix the count of the groups about to start -- those placed now, and the first
        few waiting at the head, which may start now with fewer candidates rather than later with all."""
        if not self.elastic:
            return False  # the common case; the rest orders the whole queue, once per planning pass
        placed = [self.groups[e.request_id] for _wid, entries in placements for e in entries]
        waiting = [g for g in (self.groups[rid] for rid in self.queue) if g.status is GroupStatus.ADMITTED]
        head = deadlines.order(waiting, self.config.best_effort_s)[:_ELASTIC_LOOKAHEAD * len(self.workers)]
        changed = False
        for g in dict.fromkeys(placed + head):
            if g.status is not GroupStatus.ADMITTED or g.deadline is None or g.spec.min_count >= g.served_count:
                continue
            n = deadlines.choose_count(self, g, self.now)
            if n < g.served_count:
                capability, capacity = self._capability()
                decision = decide(deadlines.served_spec(g.spec, n), capability, action_mode=g.sampling.action_mode,
                                  policy=self.config.policy, batch_capacity=capacity)
                if not decision.admitted:
                    continue  # --policy reject after an out-of-memory shrink: keep the count it was admitted with
                g.serve_first(n, decision)
                changed = True
        return changed

    def rows_of(self, w: WorkerState) -> int:
        """The rows a worker may hold: its capacity, capped by its predicted peak memory (CUDA)."""
        return self.cost.workers[w.worker_id].max_rows_for(w.memory_budget_bytes, w.capacity) \
            if w.worker_id in self.cost.workers else w.capacity

    def _slot(self, w: WorkerState) -> WorkerSlot:
        rows = self.rows_of(w)
        return WorkerSlot(w.worker_id, rows, rows - w.rows_in_use, w.forward_key)

    def _send(self, worker: WorkerState, entries, out: list) -> None:
        batch_id = self._next_batch
        self._next_batch += 1
        join = not worker.idle
        shared = join or len({e.request_id for e in entries}) > 1
        slices = []
        for entry in entries:
            g = self.groups[entry.request_id]
            dispatch = g.start_slice(entry.slice_index, worker.worker_id)
            if g.physical_batches == 0:
                self.metrics.queue_wait(self.now - g.received_at)
            g.physical_batches += 1
            g.co_batched += int(shared)
            g.joins += int(join)
            slices.append(SliceWork(g, dispatch))
        sampling = self.groups[entries[0].request_id].sampling
        assignment = Assignment(batch_id, worker.worker_id, tuple(entries), sampling.forward_key(), self.now, join,
                                sampling.forward_label())
        jobs = [j for e in entries for j in deadlines.jobs_of(self.groups[e.request_id], e)]
        sim = deadlines.sim_workers(self, self.now, only=worker.worker_id)[0]
        assignment.predicted_s = forecast_duration(self.cost, sim, jobs)
        assignment.steps = max(j.steps for j in jobs)
        assignment.cost_rows = sum(j.cost_rows for j in jobs)
        worker.assignments[batch_id] = assignment
        self.assignments[batch_id] = assignment
        self.metrics.physical_batch(assignment.rows, worker.capacity)
        if join:
            self.metrics.group_joined()
        out.append(SendWork(worker.identity, batch_id, tuple(slices), join))

    # ---- the worker link ------------------------------------------------------------------------------

    def register(self, identity: Any, reg: Registration, now: float) -> list:
        self.now = now
        out: list = []
        try:
            capability = ModelCapability.from_dict(dict(reg.capability))
            if not isinstance(reg.capacity, int) or reg.capacity < 1:
                raise ValueError("capacity must be >= 1")
        except (CandidateContractError, ValueError, TypeError) as exc:
            self.metrics.protocol_error("worker", "bad_type")
            return [StopWorker(identity, f"bad registration: {exc}")]
        old = self.workers.get(reg.worker_id)
        if old is not None:
            self._worker_lost(old, "reregistered", out)
        self.workers[reg.worker_id] = WorkerState(
            reg.worker_id, identity, capability, min(reg.capacity, capability.max_candidates_per_batch), reg.device, now,
            memory_budget_bytes=max(0, int(reg.memory_budget_bytes)), conditions_aside=reg.conditioning == "thread")
        self.cost.forget(reg.worker_id)
        for label, rows, seconds in reg.profile:
            self.cost.observe_forward(reg.worker_id, label, rows, seconds)
        out.append(AckRegistration(identity, reg.worker_id, self.config.heartbeat_interval_s))
        for rid in list(self.waiting):
            self.waiting.pop(rid)
            g = self.groups.get(rid)
            if g is not None and g.status is GroupStatus.QUEUED:
                self._admit(g, out)
        self._schedule(out)
        return out

    def _known(self, identity: Any, worker_id: str, out: list) -> WorkerState | None:
        worker = self.workers.get(worker_id)
        if worker is None or worker.identity != identity:
            # Unknown (the scheduler restarted, or we declared it dead): ask it to register again.
            out.append(StopWorker(identity, "reregister"))
            return None
        worker.last_seen = self.now
        return worker

    def heartbeat(self, identity: Any, beat: Heartbeat, now: float) -> list:
        self.now = now
        out: list = []
        worker = self._known(identity, beat.worker_id, out)
        if worker is None:
            return out
        worker.step = beat.step
        self.metrics.heartbeat()
        if beat.cache:
            self.metrics.conditioning_cache(beat.cache)
            self.cache_bytes[worker.worker_id] = int(beat.cache.get("bytes", 0))
            self.metrics.conditioning_cache_bytes_in_use(sum(self.cache_bytes.get(w, 0) for w in self.workers))
        for rows, seconds, label in beat.forwards:
            self.metrics.forward(rows, seconds)
            self.cost.observe_forward(worker.worker_id, label, rows, seconds)
        running = set(beat.running)
        for a in list(worker.assignments.values()):
            if a.batch_id in running:
                a.seen_at = now
            elif now - (a.seen_at or a.sent_at) > self.config.heartbeat_timeout_s:
                # A live worker that no longer lists an assignment lost it or its result on the link (a
                # message over MAXMSGSIZE is dropped with the connection): retry instead of waiting forever.
                self._drop_assignment(a)
                self.counters["batches_lost"] += 1
                self.metrics.worker_failure("worker_error")
                for entry in a.entries:
                    self._slice_failed(entry, worker, "worker_error",
                                       "batch lost: the worker no longer holds it and its result never arrived", out)
        self._schedule(out)
        return out

    def worker_result(self, identity: Any, result: WorkerResult, now: float) -> list:
        self.now = now
        out: list = []
        worker = self._known(identity, result.worker_id, out)
        if worker is None:
            self._late()
            return out
        a = self.assignments.get(result.batch_id)
        if a is None or a.worker_id != worker.worker_id:
            self._late()
            return out
        self._drop_assignment(a)
        report = dict(result.report or {})
        self.metrics.worker_report(report)
        self.cost.observe_group(worker.worker_id, a.label, {**report, "groups": len(a.entries), "device": worker.device})
        if a.predicted_s > 0:
            self.metrics.prediction(a.predicted_s, now - a.sent_at)
            self.cost.observe_error(a.predicted_s, now - a.sent_at)
        if len(result.outputs) != len(a.entries):
            # A wrong-shaped answer is the worker's fault: retry every member elsewhere.
            for entry in a.entries:
                self._slice_failed(entry, worker, "worker_error", "batch result has the wrong number of outputs", out)
            self._schedule(out)
            return out
        share = 1.0 / max(1, len(a.entries))
        for entry, outcome in zip(a.entries, result.outputs):
            g = self.groups.get(entry.request_id)
            if g is None or g.finished:
                continue
            g.account(report, share)
            if g.first_step_s is None and report.get("wait_s") is not None:
                g.first_step_s = max(0.0, (a.sent_at - g.received_at) + float(report["wait_s"]))
                self.metrics.first_step(g.first_step_s)
            if outcome.request_id != entry.request_id:
                self._slice_failed(entry, worker, "worker_error", "batch result answers another request", out)
            elif outcome.status == "ok":
                try:
                    g.fold(entry.slice_index, worker.worker_id, outcome)
                except ValueError as exc:  # CandidateContractError: a malformed result
                    self._slice_failed(entry, worker, "worker_error", f"malformed result: {exc}", out)
                    continue
                if g.status is GroupStatus.REDUCING:
                    g.finish()
                    self.metrics.reducer_time(g.reducer_s or 0.0)
                    self._end(g, out)
            elif outcome.status == "cancelled":
                continue  # we asked for it; the group already answered
            elif outcome.status == "error" and outcome.error_code == "out_of_memory":
                self._out_of_memory(g, entry, worker, outcome.error or "out of memory", out)
            elif outcome.status == "error" and outcome.error_code not in RETRYABLE_ERRORS and outcome.error_code:
                g.fail(outcome.error_code, outcome.error or outcome.error_code)
                self._end(g, out)
            else:
                self._slice_failed(entry, worker, "worker_error", outcome.error or "worker error", out)
        self._schedule(out)
        return out

    def _late(self) -> None:
        self.counters["late_results_discarded"] += 1
        self.metrics.late_result()

    def _drop_assignment(self, a: Assignment) -> None:
        self.assignments.pop(a.batch_id, None)
        worker = self.workers.get(a.worker_id)
        if worker is not None:
            worker.assignments.pop(a.batch_id, None)

    def _slice_failed(self, entry, worker: WorkerState, reason: str, detail: str, out: list) -> None:
        g = self.groups.get(entry.request_id)
        if g is None:
            return
        if g.fail_slice(entry.slice_index, f"{reason}: {detail}", self.config.retry_limit, worker_id=worker.worker_id):
            self.metrics.retry(reason)
            if g.finished:
                self._end(g, out)

    def _out_of_memory(self, g: Group, entry, worker: WorkerState, detail: str, out: list) -> None:
        """The slice did not fit the worker's memory: the worker holds fewer rows from now on, and the
        slice is re-planned as smaller slices (each retried from its snapshots), not failed."""
        rows = len(entry.candidate_ids)
        if rows <= 1:
            g.fail("out_of_memory", f"one candidate does not fit the worker's memory: {detail}", field="count")
            self._end(g, out)
            return
        worker.capacity = max(1, min(worker.capacity, rows - 1))
        if not g.fail_slice(entry.slice_index, f"out_of_memory: {detail}", 1 << 30, worker_id=worker.worker_id):
            return
        self.metrics.retry("out_of_memory")  # _schedule halves what no worker can hold now

    def _worker_lost(self, worker: WorkerState, reason: str, out: list) -> None:
        """The worker is gone (or presumed so): every slice it held goes back to pending, to be retried
        from its snapshots; a result it sends later is discarded."""
        self.workers.pop(worker.worker_id, None)
        self.cost.forget(worker.worker_id)  # ids carry host, pid and a uuid: a restart never reuses one
        if self.cache_bytes.pop(worker.worker_id, None) is not None:
            self.metrics.conditioning_cache_bytes_in_use(sum(self.cache_bytes.values()))
        self.metrics.worker_failure(reason)
        held = list(worker.assignments.values())
        for a in held:
            self.assignments.pop(a.batch_id, None)
        worker.assignments.clear()
        for a in held:
            for entry in a.entries:
                self._slice_failed(entry, worker, reason, "worker lost", out)

    # ---- endings ------------------------------------------------------------------------------------------

    def _end(self, g: Group, out: list) -> None:
        """Send the group's one reply and forget it. Workers still running its slices are told to stop."""
        rid = g.request_id
        for a in list(self.assignments.values()):
            if rid not in a.cancelled and any(e.request_id == rid for e in a.entries):
                worker = self.workers.get(a.worker_id)
                if worker is not None:
                    a.cancelled.add(rid)
                    out.append(CancelRows(worker.identity, a.batch_id, (rid,)))
        reply = g.take_reply()
        self.groups.pop(rid, None)
        self.queue.pop(rid, None)
        self.waiting.pop(rid, None)
        self.elastic.discard(rid)
        result = None if reply is None else g.result(reply)
        # STATUS must say what the reply said ("rejected" is a FAILED group to the state machine)
        self.finished[rid] = g.status.name.lower() if result is None else result.status
        while len(self.finished) > self.config.finished_memory:
            self.finished.popitem(last=False)
        if result is None:
            return
        self.metrics.group_completed(result.status, self.now - g.received_at)
        if result.status == "done":
            self.metrics.served(g.spec.count, g.served_count)
        if g.deadline is not None and result.status in ("done", "expired") and \
                (result.status == "expired" or self.now > g.deadline):
            self.metrics.deadline_miss()
        out.append(Reply(g.client, result))

    def tick(self, now: float) -> list:
        """Deadlines, heartbeat timeouts, gauges, and planning: called by the shell a few times a second."""
        self.now = now
        out: list = []
        for g in list(self.groups.values()):
            if g.deadline is not None and g.expire(now):
                self._end(g, out)
        for w in list(self.workers.values()):
            if now - w.last_seen > self.config.heartbeat_timeout_s:
                self._worker_lost(w, "heartbeat_timeout", out)
        self.metrics.queue_depth(self.queued_groups(), self.queued_candidates())
        self.metrics.live_workers(len(self.workers))
        self._schedule(out)
        return out

    def shutdown(self, now: float) -> list:
        """Answer every group in flight (`shutting_down`) and ask every worker to register again: the
        scheduler may come back on the same port."""
        self.now = now
        self.draining = True
        out: list = []
        for g in list(self.groups.values()):
            g.fail("shutting_down", "the scheduler is shutting down")
            self._end(g, out)
        out.extend(StopWorker(w.identity, "reregister") for w in self.workers.values())
        return out

    # ---- control ------------------------------------------------------------------------------------------

    def cancel(self, request_id: str, now: float) -> tuple[ControlAnswer, list]:
        """Idempotent; says what it changed and in which state it found the group."""
        self.now = now
        g = self.groups.get(request_id)
        if g is None:
            state = self.finished.get(request_id, "unknown")
            self.metrics.cancellation("done" if state != "unknown" else "unknown")
            return ControlAnswer(ok=True, changed=False, state=state), []
        hit = g.status.name.lower()
        out: list = []
        changed = g.cancel()
        if changed:
            self.metrics.cancellation(hit)
            self._end(g, out)
            self._schedule(out)
        return ControlAnswer(ok=True, changed=changed, state=hit), out

    def status(self, request_id: str) -> ControlAnswer:
        g = self.groups.get(request_id)
        if g is None:
            return ControlAnswer(ok=True, state=self.finished.get(request_id, "unknown"))
        return ControlAnswer(ok=True, state=g.status.name.lower(), detail={
            "count": g.spec.count,
            "slices": len(g.slices),
            "pending_slices": len(g.pending_slices()),
            "running_slices": len(g.running_slices()),
            "candidates_done": len(g.partial.done()),
        })

    def drain(self) -> ControlAnswer:
        changed = not self.draining
        self.draining = True
        return ControlAnswer(ok=True, changed=changed, state="draining", detail={"in_flight": len(self.groups)})

    def queued_groups(self) -> int:
        # queued = admitted or waiting for a worker, not yet started; running groups are not queued
        return len(self.waiting) + sum(1 for rid in self.queue if self.groups[rid].status is GroupStatus.ADMITTED)

    def queued_candidates(self) -> int:
        return sum(len(c) for rid in self.queue for _i, c in self.groups[rid].pending_slices())

    def stats(self) -> dict:
        return {
            "groups_in_flight": len(self.groups),
            "queued_groups": self.queued_groups(),
            "queued_candidates": self.queued_candidates(),
            "batching": self.config.batching,
            "workers": {
                w.worker_id: {"capacity": w.capacity, "device": w.device, "busy": not w.idle, "step": w.step,
                              "rows_in_use": w.rows_in_use, "assignments": len(w.assignments)}
                for w in self.workers.values()
            },
            # what the model can do (the first live worker's; a fleet serves one model), for fronts' metadata
            "capability": next(iter(self.workers.values())).capability.to_dict() if self.workers else None,
            "batches_in_flight": len(self.assignments),
            "draining": self.draining,
            "late_results_discarded": self.counters["late_results_discarded"],
            "batches_lost": self.counters["batches_lost"],
            "handler_errors": self.counters["handler_errors"],
        }
