"""The engine's side of the worker link: registrations, heartbeats, results, workers leaving and lost.

`WorkerLink` holds no state of its own: it is the half of the engine (core/engine.py) that reads what
workers send, kept in its own file. Each handler runs inside one of the engine's atomic events and adds
its messages to the engine's outbox.

A result is taken apart slice by slice: `outcomes.classify` decides what each slice's outcome means
(fold, retry, fail, out of memory, ignore) and the handler applies it, each slice under its own guard,
so code that raises on one slice fails that slice's group alone.

Failure taxonomy. Retried from the candidates' snapshots (up to `retry_limit` attempts per slice): a
worker that died, stopped heartbeating, lost a result on the link, sent a malformed result, or
reported a transient fault. Answered at once: an exception inside the model (`model_error`) and a
request the model cannot run (its own codes) -- no retry can fix either. Out of memory: the worker
holds fewer rows, the slice is planned again.

Leaving. A worker that is told to go (SIGTERM: a rolling update, a scale-down, a preemption notice)
says `Leaving` first. It leaves the fleet at once -- no new work, no place in the forecasts or in the
slicing -- and is told which assignments it still owes (`AckLeaving`: everything sent and not
answered; one it never received was lost on the link, and is retried). It answers them as usual -- but
those still waiting for its rows it gives back (`GiveBack`), to run elsewhere at once without counting an
attempt -- then says `Left` and is forgotten there and then. When it finishes within its grace period, its groups lose
nothing: no slice runs twice and none waits out a heartbeat timeout. Work it did not finish (it says
`Left` anyway) is retried elsewhere, as a lost worker's is; a leaving worker that goes silent is lost
when its heartbeats lapse. An operator may ask for the same (core/control.py `worker_leave`).
"""

from __future__ import annotations

import math
from typing import Any

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.group_state import GroupStatus
from candidate_scheduler.core.messages import (
    LEAVE,
    REREGISTER,
    AckLeaving,
    AckRegistration,
    GiveBack,
    Heartbeat,
    Leaving,
    Left,
    Registration,
    StopWorker,
    WorkerResult,
)
from candidate_scheduler.core.outcomes import Verdict, classify
from candidate_scheduler.core.prefetch import next_margin
from candidate_scheduler.core.request_scope import redacted
from candidate_scheduler.core.spec import ModelCapability
from candidate_scheduler.core.workers import Assignment, WorkerState

# A worker's id travels in every heartbeat and result and is named in `stats`: one of megabytes made
# each of those that large (a STATS reply went over the message limit). A default id is host-pid-random.
MAX_WORKER_ID_CHARS = 512
MAX_DEVICE_CHARS = 64


def check_worker_id(worker_id: object) -> str:
    """`worker_id` if it may name a worker: 1 to MAX_WORKER_ID_CHARS printable characters; else ValueError."""
    if not isinstance(worker_id, str) or not 0 < len(worker_id) <= MAX_WORKER_ID_CHARS or not worker_id.isprintable():
        raise ValueError(f"a worker id must be 1 to {MAX_WORKER_ID_CHARS} printable characters, "
                         f"got {str(worker_id)[:80]!r}{'...' if len(str(worker_id)) > 80 else ''}")
    return worker_id


class WorkerLink:
    def __init__(self, engine):
        self.engine = engine
        # The margin gauges (the largest is O(workers) to find) are set at most once a second of the
        # engine's clock, after a margin moved: noisy errors move one at most results of a busy fleet
        self._margins_moved = False
        self._margins_due = -math.inf

    # ---- registration and heartbeats ------------------------------------------------------------------

    def register(self, identity: Any, reg: Registration) -> None:
        e = self.engine
        try:
            check_worker_id(reg.worker_id)
            capability = ModelCapability.from_dict(dict(reg.capability))
            if not isinstance(reg.capacity, int) or reg.capacity < 1:
                raise ValueError("capacity must be >= 1")
            if not isinstance(reg.device, str) or len(reg.device) > MAX_DEVICE_CHARS:
                raise ValueError(f"device must be a string of at most {MAX_DEVICE_CHARS} characters")
        except (CandidateContractError, ValueError, TypeError) as exc:
            e.metrics.protocol_error("worker", "bad_type")
            e.outbox.append(StopWorker(identity, f"bad registration: {exc}"))
            return
        old = e.worker_of(reg.worker_id)
        if old is not None:
            if old.identity == identity and old.registration == reg and reg.worker_id in e.workers:
                # The same live process asking again on the same connection: it repeats an unanswered REGISTER every
                # few seconds, so a stalled scheduler reads two. Taken for a restart, the second failed the
                # work sent in between (the worker still ran it) and spent its attempts. It is answered again.
                old.last_seen = e.now
                e.outbox.append(AckRegistration(identity, reg.worker_id, e.config.heartbeat_interval_s))
                return
            self.lost(old, "reregistered", "register")
        e.workers[reg.worker_id] = WorkerState(
            reg.worker_id, identity, capability, min(reg.capacity, capability.max_candidates_per_batch), reg.device,
            e.now, memory_budget_bytes=max(0, int(reg.memory_budget_bytes)),
            conditions_aside=reg.conditioning == "thread", registered_rows=reg.capacity, on_stale=e.views.stale,
            registration=reg)
        # Kept, the worker is acknowledged and the groups waiting for one admitted whatever raises in between:
        # else the worker waits for an answer, and they for a registration that may never come.
        with e.guard("register"):
            e.cost.forget(reg.worker_id)
            e.forget_cost(reg.worker_id)
            for label, rows, seconds in reg.profile:  # rows 0: a group's fixed cost at that shape (worker/profile.py)
                if rows == 0:
                    e.cost.observe_fixed(reg.worker_id, label, seconds)
                else:
                    e.cost.observe_forward(reg.worker_id, label, rows, seconds)
        with e.guard("register"):
            e.rows_changed()
        e.outbox.append(AckRegistration(identity, reg.worker_id, e.config.heartbeat_interval_s))
        for rid in list(e.waiting):
            e.waiting.pop(rid)
            g = e.groups.get(rid)
            if g is not None and g.status is GroupStatus.QUEUED:
                with e.guard("register", rid):
                    e.admit(g)

    def known(self, identity: Any, worker_id: str) -> WorkerState | None:
        e = self.engine
        worker = e.worker_of(worker_id)
        if worker is None or worker.identity != identity:
            # Unknown (the scheduler restarted, or we declared it dead): ask it to register again.
            e.outbox.append(StopWorker(identity, REREGISTER))
            return None
        worker.last_seen = e.now
        return worker

    def heartbeat(self, identity: Any, beat: Heartbeat) -> None:
        e = self.engine
        worker = self.known(identity, beat.worker_id)
        if worker is None:
            return
        worker.step = beat.step
        e.metrics.heartbeat()
        if worker.worker_id in e.leaving and not worker.said_leaving:
            # an operator asked it to leave (core/control.py) and it has not said so: the request may have
            # been lost on the link (a reconnect), so it is asked again; a worker asked twice leaves once
            e.outbox.append(StopWorker(identity, LEAVE))
        if beat.cache:
            e.metrics.conditioning_cache(beat.cache)
            e.cache_bytes[worker.worker_id] = int(beat.cache.get("bytes", 0))
            e.metrics.conditioning_cache_bytes_in_use(sum(e.cache_bytes.values()))  # live and leaving workers
        for rows, seconds, label in beat.forwards:
            e.metrics.forward(rows, seconds)
            e.cost.observe_forward(worker.worker_id, label, rows, seconds)
        running = set(beat.running)
        for a in list(worker.assignments.values()):
            if a.batch_id in running:
                a.seen_at = e.now
            elif e.now - (a.seen_at or a.sent_at) > e.config.heartbeat_timeout_s:
                # A live worker that no longer lists an assignment lost it or its result on the link (a
                # message over MAXMSGSIZE is dropped with the connection): retry instead of waiting forever.
                ran = self.running(worker)
                self.drop(a)
                with e.guard("heartbeat"):
                    self.reanchor(worker, ran)
                e.counters["batches_lost"] += 1
                with e.guard("heartbeat"):
                    e.metrics.worker_failure("worker_error")
                for entry in a.entries:
                    with e.guard("heartbeat", entry.request_id):
                        self.slice_failed(a, entry, worker, "worker_error",
                                          "batch lost: the worker no longer holds it and its result never arrived")

    # ---- leaving ----------------------------------------------------------------------------------------

    def leaving(self, identity: Any, msg: Leaving) -> None:
        """The worker is going: out of the fleet now, and told what it still owes (asked again, told again)."""
        e = self.engine
        worker = self.known(identity, msg.worker_id)
        if worker is None:
            return
        self.out_of_fleet(worker)
        worker.said_leaving = True
        e.outbox.append(AckLeaving(identity, tuple(worker.assignments)))

    def out_of_fleet(self, worker: WorkerState) -> bool:
        """A live worker becomes a leaving one: nothing new is sent to it. Whether it was live."""
        e = self.engine
        if e.workers.pop(worker.worker_id, None) is None:
            return False
        e.leaving[worker.worker_id] = worker
        e.held_back.pop(worker.worker_id, None)
        e.rows_changed()  # its rows leave the slicing, the views and the forecasts
        return True

    def left(self, identity: Any, msg: Left) -> None:
        """The worker's last word: forget it now. What it still holds (its grace ran out) is retried."""
        e = self.engine
        worker = e.worker_of(msg.worker_id)
        if worker is None or worker.identity != identity:
            return  # forgotten already (lost, or a LEFT sent twice): nothing to do, and no one to tell
        finished = not worker.assignments
        with e.guard("left"):
            e.metrics.worker_departure("finished" if finished else "unfinished")
        if finished:
            self._forget_worker(worker, "left")
        else:
            self.lost(worker, "left_unfinished", "left")

    def gave_back(self, identity: Any, msg: GiveBack) -> None:
        """A leaving worker's assignments it had not started (they waited for its rows): run elsewhere
        now, from their snapshots (the same bits), not after what it runs before it goes."""
        e = self.engine
        worker = e.leaving.get(msg.worker_id)
        if worker is None or worker.identity != identity:
            return  # only a leaving worker gives back: a live one would bounce work at no attempt's cost
        for batch_id in msg.batch_ids:
            a = e.assignments.get(batch_id)
            if a is None or a.worker_id != worker.worker_id:
                continue  # answered, or retried already
            self.drop(a)
            for entry in a.entries:
                with e.guard("give_back", entry.request_id):
                    g = None if entry.request_id in a.cancelled else e.groups.get(entry.request_id)  # ended: not
                    if g is not None and g.return_slice(entry.slice_index, worker.worker_id):  # its namesake
                        e.metrics.given_back()
                        e.requeue(g, entry.slice_index)

    # ---- results --------------------------------------------------------------------------------------

    def result(self, identity: Any, result: WorkerResult) -> None:
        e = self.engine
        worker = self.known(identity, result.worker_id)
        a = None if worker is None else e.assignments.get(result.batch_id)
        if a is None or a.worker_id != worker.worker_id:
            e.counters["late_results_discarded"] += 1
            e.metrics.late_result()
            return
        # what could have run there when this answer was made: the out-of-memory blame when the worker
        # does not say (a prefetched assignment waits on the worker: it ran nothing)
        rows_in_use = min(worker.rows_in_use, worker.rows) if e.config.batching == "step" else a.rows
        ran = self.running(worker)
        self.drop(a)
        with e.guard("result"):  # bookkeeping: whatever raises here, the slices below are still answered
            self.reanchor(worker, ran)
            if e.config.prefetch and e.config.prefetch_lead_s < math.inf and worker.worker_id in e.workers:
                self._learn_margin(worker)  # a leaving worker is sent nothing more: no margin to learn
                e.metrics.prefetch_margin(max(e.prefetch_margin.values()))
        report = dict(result.report or {})
        with e.guard("result"):  # bookkeeping: whatever raises here, the slices below are still answered
            e.metrics.worker_report(report)
            e.cost.observe_group(worker.worker_id, a.label, {**report, "groups": len(a.entries),
                                                             "device": worker.device})
            if report.get("peak_memory_bytes") and worker.device != "cpu" and worker.worker_id in e.workers:
                e.rows_changed()  # a memory observation may change the rows it may hold
            if a.predicted_s > 0:
                e.metrics.prediction(a.predicted_s, e.now - a.sent_at)
                self._margins_moved |= e.cost.observe_error(worker.worker_id, a.predicted_s, e.now - a.sent_at)
            self.publish_due_margins()
        if len(result.outputs) != len(a.entries):
            # A wrong-shaped answer is the worker's fault: retry every member elsewhere.
            for entry in a.entries:
                with e.guard("result", entry.request_id):
                    self.slice_failed(a, entry, worker, "worker_error", "batch result has the wrong number of outputs")
        else:
            share = 1.0 / max(1, len(a.entries))
            for entry, outcome in zip(a.entries, result.outputs):
                with e.guard("result", entry.request_id):
                    self._take(a, worker, entry, outcome, report, share, rows_in_use)

    def running(self, worker: WorkerState) -> set[int]:
        """The assignments the worker runs now; the rest wait on it. Dispatch: the first sent; step: those
        that fit its rows, in the order sent (the order the worker admits them)."""
        out, rows = set(), 0
        for batch_id, a in worker.assignments.items():
            rows += a.rows
            if out and (self.engine.config.batching == "dispatch" or rows > worker.rows):
                break
            out.add(batch_id)
        return out

    def reanchor(self, worker: WorkerState, ran: set[int]) -> None:
        """Work ended, so what waited on the worker for it starts now (`ran`: what ran before): its
        predicted end is now plus what it takes to run, not the end predicted when it was sent -- which
        counted on the work before it ending when predicted, and so carried that error into every later
        prediction. Under dispatch batching each batch held after it then follows it."""
        now = t = self.engine.now
        starting = self.running(worker) - ran
        for batch_id, a in worker.assignments.items():
            if batch_id in ran or a.run_s <= 0:  # still running, or no run time to predict from: kept
                t = a.ends_at
            elif self.engine.config.batching == "dispatch":  # one batch after another
                a.ends_at = t = t + a.run_s
            elif batch_id in starting:  # it joins the running batch at the next step
                a.ends_at = now + a.run_s
        worker.stale()

    def _learn_margin(self, worker: WorkerState) -> None:
        """Late prefetch: a worker left with nothing to run while work it could run waits had its next
        work sent too late; its margin grows, or else shrinks (core/prefetch.py)."""
        e = self.engine
        if worker.worker_id in e.held_back:
            starved = False  # idle on purpose, until its staggered start (core/stagger.py)
        elif e.config.batching == "dispatch":
            starved = worker.idle and len(e.pending) > 0
        else:
            free = worker.rows - worker.rows_in_use
            key = next(iter(worker.assignments.values())).forward_key if worker.assignments else None
            starved = free > 0 and e.pending.could_join(key, free)
        wid = worker.worker_id
        e.prefetch_margin[wid] = next_margin(e.prefetch_margin.get(wid, 0.0), starved, e.config.prefetch_lead_s)

    def _take(self, a: Assignment, worker: WorkerState, entry, outcome, report: dict, share: float,
              rows_in_use: int) -> None:
        """Apply one slice's outcome, as `classify` judges it."""
        e = self.engine
        g = e.groups.get(entry.request_id)
        cancelled_here = entry.request_id in a.cancelled
        live = g is not None and not g.finished and not cancelled_here
        if live:
            g.account(report, share)
            g.forecasts[a.batch_id] = (a.label, a.rows, a.predicted_s, e.now - a.sent_at)
            if g.first_step_s is None and report.get("wait_s") is not None:
                g.first_step_s = max(0.0, (a.sent_at - g.received_at) + float(report["wait_s"]))
                e.metrics.first_step(g.first_step_s)
        judged = classify(live, entry.request_id, outcome, cancelled_here)
        detail = judged.detail
        if e.scoped_ids and detail:  # a worker's error for its batch may name another principal's group
            detail = redacted(detail, entry.request_id,
                              (x.request_id for b in (a, *worker.assignments.values()) for x in b.entries))
        if judged.verdict is Verdict.FOLD:
            try:
                g.fold(entry.slice_index, worker.worker_id, outcome)
            except CandidateContractError as exc:  # a malformed result
                self.slice_failed(a, entry, worker, "worker_error", f"malformed result: {exc}")
                return
            if g.status is GroupStatus.REDUCING:
                g.finish()
                e.metrics.reducer_time(g.reducer_s or 0.0)
                e.end(g)
        elif judged.verdict is Verdict.RETRY:
            self.slice_failed(a, entry, worker, "worker_error", detail)
        elif judged.verdict is Verdict.FAIL:
            g.fail(judged.code, detail)
            e.end(g)
        elif judged.verdict is Verdict.OUT_OF_MEMORY:
            self._out_of_memory(g, entry, worker, a, detail, report, rows_in_use)

    def _out_of_memory(self, g, entry, worker: WorkerState, a: Assignment, detail: str, report: dict,
                       rows_in_use: int) -> None:
        """The rows the worker ran when it ran out of memory did not fit. The worker says which: the rows
        of the forward that failed and the step it failed at (`oom_rows`, `oom_step`); every assignment
        that shared that step answers out_of_memory with the same step, so the incident lowers the
        worker's rows once, below them. Each slice is planned again (split when no worker can hold it).
        One row running alone is one candidate of that forward shape too many for this worker, whatever
        its capacity for others: the shape goes to the other workers (core/fleet_rows.py), and the group
        fails only when none is left to take it."""
        e = self.engine
        rows = int(report.get("oom_rows") or 0) or rows_in_use
        if rows <= 1:
            worker.refused_labels = worker.refused_labels | {g.label}
            if worker.worker_id in e.workers:
                e.rows_changed()  # the views carry what it refuses; admission reads whether anyone takes it
            if any(g.label not in w.refused_labels for w in e.workers.values() if w is not worker):
                if g.fail_slice(entry.slice_index, f"out_of_memory on {worker.worker_id}: {detail}",
                                e.config.retry_limit, worker_id=worker.worker_id, counted=False):
                    e.metrics.retry("out_of_memory")
                    e.requeue(g, entry.slice_index)
                return
            g.fail("out_of_memory", f"one candidate does not fit any live worker's memory: {detail}", field="count")
            e.end(g)
            return
        key = ("step", report["oom_step"]) if "oom_step" in report else ("batch", a.batch_id)
        # the same incident only for work sent before it was counted: a worker that numbers its incidents by
        # the steps it ran (before 2026-12-05) gives two failures in a row, no step between, one number
        if key != worker.oom_key or a.batch_id >= worker.oom_since:
            worker.oom_key, worker.oom_rows, worker.oom_since = key, rows, e.next_batch
            worker.capacity = max(1, min(worker.capacity, rows - 1))
            if worker.worker_id in e.workers:  # a leaving worker's rows are out of the fleet already
                e.rows_changed()
        if g.fail_slice(entry.slice_index, f"out_of_memory: {detail}", e.config.retry_limit,
                        worker_id=worker.worker_id, counted=False):
            e.metrics.retry("out_of_memory")  # the planning pass halves what no worker can hold now
            e.requeue(g, entry.slice_index)

    def slice_failed(self, a: Assignment, entry, worker: WorkerState, reason: str, detail: str) -> None:
        e = self.engine
        g = e.groups.get(entry.request_id)
        if g is None or entry.request_id in a.cancelled:  # its group ended: the id may be a new group's now
            return
        if g.fail_slice(entry.slice_index, f"{reason}: {detail}", e.config.retry_limit, worker_id=worker.worker_id):
            if g.finished:  # its retries are spent: the group failed, nothing is retried
                e.end(g)
            else:
                e.metrics.retry(reason)
                e.requeue(g, entry.slice_index)

    # ---- workers and assignments that are gone ------------------------------------------------------------

    def drop(self, a: Assignment) -> None:
        e = self.engine
        e.assignments.pop(a.batch_id, None)
        worker = e.worker_of(a.worker_id)
        if worker is not None:
            worker.release(a.batch_id)
        for entry in a.entries:
            held = e.held.get(entry.request_id)
            if held is not None:
                held.discard(a.batch_id)
                if not held:
                    del e.held[entry.request_id]

    def publish_due_margins(self) -> None:
        """The margin gauges, when a margin moved since they were last set and a second has passed: a move
        within the second after a publication waits for the next result or tick, never for good."""
        if self._margins_moved and self.engine.now >= self._margins_due:
            self._publish_margins()

    def _publish_margins(self) -> None:
        e = self.engine
        e.metrics.forecast_margins(e.cost.margin(), e.cost.largest_margin())
        self._margins_moved, self._margins_due = False, e.now + 1.0

    def _forget_worker(self, worker: WorkerState, event: str) -> list[Assignment]:
        """Out of the engine, live or leaving; what it held, taken back (the caller retries it)."""
        e = self.engine
        # What it held is taken first, and each step after on its own: whatever raises, the caller still
        # retries all of it (a fault here once left its groups running on a worker that was gone, for good).
        held = list(worker.assignments.values())
        live = e.workers.pop(worker.worker_id, None) is not None
        e.leaving.pop(worker.worker_id, None)
        e.prefetch_margin.pop(worker.worker_id, None)
        for a in held:
            with e.guard(event):
                self.drop(a)
                worker.release(a.batch_id)
            e.assignments.pop(a.batch_id, None)  # whatever raised above, none of it is out on a worker any more
        with e.guard(event):
            e.cost.forget(worker.worker_id)  # ids carry host, pid and a uuid: a restart never reuses one
            e.forget_cost(worker.worker_id)
        with e.guard(event):
            if live:  # a leaving worker's rows left the fleet when it said so
                e.rows_changed()
        with e.guard(event):
            if e.cache_bytes.pop(worker.worker_id, None) is not None:
                e.metrics.conditioning_cache_bytes_in_use(sum(e.cache_bytes.values()))
            if e.config.prefetch and e.config.prefetch_lead_s < math.inf:  # the gauge forgets its margin too
                e.metrics.prefetch_margin(max(e.prefetch_margin.values(), default=0.0))
            self._publish_margins()  # and this one its own
        return held

    def lost(self, worker: WorkerState, reason: str, event: str) -> None:
        """The worker is gone (or presumed so): every slice it held goes back to pending, to be retried
        from its snapshots; a result it sends later is discarded."""
        e = self.engine
        held = self._forget_worker(worker, event)
        with e.guard(event):  # bookkeeping: whatever raises here, the slices below are still retried
            e.metrics.worker_failure(reason)
        for a in held:
            for entry in a.entries:
                with e.guard(event, entry.request_id):
                    self.slice_failed(a, entry, worker, reason, "worker lost")
