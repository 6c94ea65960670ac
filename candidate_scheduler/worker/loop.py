"""The worker process: one DEALER to the scheduler's worker link, one model adapter, a running batch.

Two threads, so heartbeats and cancels keep flowing while the model computes:

- the I/O thread owns the ZMQ DEALER: it registers, sends heartbeats (listing every assignment it holds and
  the forwards run since the last one), receives BATCH and JOIN (decoded there and handed to the compute
  thread, which admits them as its rows allow: running.py) and CANCEL_ROWS (recorded in a lock-guarded map
  the compute thread reads at each step boundary, and woken for when it waits for the conditioning thread
  with nothing to step), and forwards results that the compute thread pushes through an inproc PAIR (so a
  result leaves at once, not at the next poll tick);
- the compute thread owns the running batch (running.py): at every step boundary it admits the
  assignments that arrived, drops cancelled groups, runs one denoise step of everything running, and
  answers each assignment as soon as all its groups are done -- a short group never waits for a long one;
- with an adapter that allows it (and `conditioning="thread"`, the default), the conditioning thread
  (preparing.py) starts the groups that arrive while others run, so a joiner's VAE encode and text
  pathway never stall the groups already running; started groups come back through the compute thread's
  inbox. With nothing running, the compute thread starts them itself (running.py says why).

If the scheduler forgets us (restart, or it declared us dead), it answers WORKER_STOP("reregister") and we
register again (ZMQ reconnects by itself). What we held is then dropped, unanswered: that scheduler retries it
elsewhere, or is a new one that never heard of it, and either way would discard the answers as late while its
own first assignments waited behind that work. Answers carry the epoch (one per REREGISTER) they were computed
in, and the I/O thread drops those of an earlier one.

Sends never block (link.py): a scheduler that has been away for minutes must not stall the I/O thread.

The compute thread never dies of a worker bug: whatever escapes a turn of its loop is logged with its traceback,
and every assignment it holds is answered (`worker_error` for the groups without an output, which the scheduler
retries) before it goes on with an empty running batch. Should it die anyway, the I/O thread notices and leaves
(LEFT), so the scheduler retries what we held at once, not after heartbeats list it forever (`WorkerFailed`).

`leave(grace_s)` (SIGTERM, or WORKER_STOP("leave") when an operator asks the scheduler) goes
gracefully: LEAVING, finish what the scheduler says we owe, LEFT (leaving.py). A second SIGTERM, or
`stop()`, stops at once: after STOP_WAIT_S, a step still running (a wedged device) is left behind.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass

import zmq

from candidate_scheduler import protocol
from candidate_scheduler.core.messages import LEAVE, REREGISTER
from candidate_scheduler.worker import link
from candidate_scheduler.worker.answers import encode_result
from candidate_scheduler.worker.leaving import Departure
from candidate_scheduler.worker.preparing import Prepared, Preparer, supports_concurrent_start
from candidate_scheduler.worker.running import (
    Arrival,
    Assignment,
    RunningBatch,
    abandoned_outputs,
    arrival_from_wire,
    assignment_of,
)
from candidate_scheduler.worker.stepping import StepAdapter

log = logging.getLogger("candidate_scheduler.worker")

DEFAULT_HEARTBEAT_INTERVAL_S = 0.5  # until the scheduler's REGISTERED says otherwise
MIN_HEARTBEAT_INTERVAL_S = 0.05
MAX_HEARTBEAT_INTERVAL_S = 60.0
UNANSWERED_WARN_S = 10.0  # REGISTER unanswered this long is said in the log (and again each 6x as long)
_MAX_FORWARD_RECORDS = 1024  # per heartbeat; older ones are dropped rather than growing without bound
_TAG = struct.Struct(">QQ")  # (assignment id, epoch) in front of each answer on the inproc pipe
COMPUTE_FAILED = "compute_failed"  # LEFT's reason when the compute thread died
STOP_WAIT_S = 5.0  # how long a stop waits for the step in progress to end


class WorkerFailed(RuntimeError):
    """The compute thread died: the worker left (LEFT) and cannot serve any more."""


class _Poke:
    """For the compute thread: a cancel or a give-back to act on, should it be waiting for the
    conditioning thread with nothing to step (it reads them only between turns)."""


_POKE = _Poke()


@dataclass(frozen=True)
class Reset:
    """For the compute thread: the scheduler forgot us; let go of everything held, unanswered (from now on, `epoch`)."""

    epoch: int


class Worker:
    def __init__(
        self,
        scheduler_endpoint: str,
        adapter: StepAdapter,
        *,
        capacity: int | None = None,
        device: str = "cpu",
        worker_id: str | None = None,
        curve_dir: str | None = None,
        register_timeout_s: float = 2.0,
        unanswered_warn_s: float = UNANSWERED_WARN_S,
        step_delay_s: float = 0.0,
        warmup_shapes: list[tuple[int, int]] | None = None,
        memory_budget_bytes: int = 0,
        leave_grace_s: float = 25.0,
        conditioning: str = "thread",
    ):
        self.endpoint = scheduler_endpoint
        self.adapter = adapter
        capability = adapter.capability_dict()
        self.capacity = int(capacity or capability["max_candidates_per_batch"])
        self.device = device
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.curve_dir = curve_dir
        self.register_timeout_s = register_timeout_s
        self.unanswered_warn_s = unanswered_warn_s
        # A test/benchmark knob: stretch each denoise step so a fault or a cancel can be placed at a
        # chosen step of a real model run. 0 in production.
        self.step_delay_s = step_delay_s
        self.warmup_shapes = [(64, 64)] if warmup_shapes is None else warmup_shapes
        self.memory_budget_bytes = memory_budget_bytes
        if conditioning not in CONDITIONING_MODES:
            raise ValueError(f"conditioning must be one of {CONDITIONING_MODES}, got {conditioning!r}")
        # "inline": every start runs on the compute thread (the benchmark's before arm); "thread" falls
        # back to it for an adapter whose start may not run beside its steps
        self.conditioning = conditioning if supports_concurrent_start(adapter) else "inline"
        self.profile: list[tuple[str, int, float]] = []
        self.heartbeat_interval_s = DEFAULT_HEARTBEAT_INTERVAL_S
        self.ctx = zmq.Context()
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # guards _cancelled, _giving_back, _forwards and _step
        self._cancelled: dict[int, set[str]] = {}
        self._giving_back = False  # leaving, and the scheduler knows: hand back what has not started
        self._forwards: list[tuple[int, float, str]] = []
        self._step: int | None = None
        self._held: list[int] = []  # assignment ids received and whose answer is not sent yet (I/O thread only)
        self._outbox = link.Outbox()  # answers the link could not take yet (I/O thread only)
        self._epoch = 0  # REREGISTERs so far: answers of an earlier epoch are dropped (I/O thread only)
        self._answer_epoch = 0  # the epoch of the last Reset the compute thread took (compute thread only)
        self._arriving: Arrival | None = None  # an assignment being admitted (compute thread only)
        self._answering: list[Assignment] = []  # done, taken off the batch, not answered yet (compute thread only)
        self._cache_seen: dict[str, int] = {}  # the counters the last heartbeat sent carried (I/O thread only)
        self._cache_failed = False  # reading them raised (logged once)
        self._stop = threading.Event()
        self.leave_grace_s = leave_grace_s  # how long a leave (SIGTERM, or an operator's) waits for what it holds
        self._leave_asked_s: float | None = None  # a leave was asked, with this grace (the I/O thread acts on it)
        self._signalled = False  # a SIGTERM asked it: a second one stops at once
        self.interrupted = False  # a SIGINT stopped it (interrupt())
        self._links_open = False  # serve opens sockets: a SIGINT must stop it (raised mid-connect, ctx.term hung)
        self._departure: Departure | None = None  # LEAVING sent: when we may go (I/O thread only)
        self.left_reason: str | None = None  # why we went, once LEFT is sent
        self.registered = threading.Event()
        self._registered_asked = 0.0  # when the last REGISTER went out
        self._unanswered: tuple[float, float] | None = None  # (first REGISTER unanswered, next warning), monotonic
        self._wake_addr = f"inproc://worker-results-{id(self)}"
        self._mangle = getattr(adapter, "mangle_result", None)  # fault injection (faults.py) only

    # ---- compute side ------------------------------------------------------------------------------
    def _compute_loop(self) -> None:
        out = self.ctx.socket(zmq.PAIR)
        out.connect(self._wake_addr)
        preparer = Preparer(self.adapter.start, self._inbox.put) if self.conditioning == "thread" else None
        batch = RunningBatch(self.adapter, self.capacity, self.step_delay_s, preparer)
        try:
            while not self._stop.is_set():
                try:
                    if not self._compute_turn(batch, out):
                        return
                except Exception as exc:  # noqa: BLE001 - a worker bug must not strand what the worker holds
                    log.exception("the compute thread failed: answering what it holds with worker_error")
                    self._abandon(batch, out, exc)
        finally:
            if preparer is not None:
                preparer.close()
            out.close(0)

    def _compute_turn(self, batch: RunningBatch, out) -> bool:
        """Admit what arrived, drop what was cancelled, give back what a leave hands back, run one step,
        answer what is done. False: stop."""
        # nothing to run or answer: wait for an assignment, or a group the preparer is starting
        if not self._take_new(batch, block=batch.waiting):
            return False
        with self._lock:
            cancelled = {k: set(v) for k, v in self._cancelled.items()}
            giving_back = self._giving_back
        batch.drop(cancelled)
        if giving_back:  # leaving: what waits for our rows is run elsewhere now
            batch.leaving = True  # and nothing more is conditioned early, only to be given back
            for batch_id in batch.give_back():
                msg = protocol.GiveBackMsg(self.worker_id, [batch_id])
                out.send_multipart([self._tag(batch_id), *protocol.encode(protocol.Kind.GIVE_BACK, msg)])
        if not batch.idle:
            with self._lock:
                self._step = batch.steps_run
            forwards, rows, seconds, label = batch.step()
            if forwards:
                # per forward: exact when the step ran one forward (groups of one cohort)
                record = (max(1, rows // forwards), seconds / forwards, label)
                with self._lock:
                    self._forwards.extend([record] * forwards)
                    del self._forwards[:-_MAX_FORWARD_RECORDS]
        # off the batch now: should answering one raise, `_abandon` answers it and those after it
        self._answering = batch.take_done()
        while self._answering:
            a = self._answering[0]
            self._answer(out, a.batch_id, self._outputs(a), a.wire_report)
            self._answering.pop(0)
        if batch.idle:
            with self._lock:
                self._step = None
        return True

    def _outputs(self, a: Assignment) -> list:
        """A done assignment's outputs, in its groups' order, as the fault-injection hook leaves them."""
        outputs = [a.outputs[i] for i in range(len(a.items))]
        if self._mangle is None:
            return outputs
        try:
            return self._mangle([it for it in a.items if it is not None], outputs)
        except Exception:  # noqa: BLE001 - a drill's hook must not cost the assignment, nor the running batch
            log.exception("the fault-injection hook failed on assignment %d: answered as computed", a.batch_id)
            return outputs

    def _abandon(self, batch: RunningBatch, out, exc: BaseException) -> None:
        """After a failed turn: answer every assignment held (and one caught half-way into the batch), and
        go on with nothing."""
        gone = self._answering + batch.abandon()
        self._answering = []
        arriving, self._arriving = self._arriving, None
        if arriving is not None and all(a.batch_id != arriving.batch_id for a in gone):
            gone.append(assignment_of(arriving))
        with self._lock:
            self._step = None
        for a in gone:
            self._answer(out, a.batch_id, abandoned_outputs(a, exc), a.wire_report)

    def _answer(self, out, batch_id: int, outputs: list, report) -> None:
        """Encode an assignment's BATCH_RESULT (`report()`: its report) and hand it to the I/O thread."""
        try:
            frames = encode_result(self.worker_id, batch_id, outputs, report)  # what fails there fails one group
        except Exception as exc:  # noqa: BLE001 - an unencodable result still gets an answer
            log.exception("assignment %d could not be encoded", batch_id)
            outputs = [protocol.GroupOutputMsg(o.request_id, "error", error=f"{type(exc).__name__}: {exc}",
                                               error_code="worker_error") for o in outputs]
            frames = protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(self.worker_id, batch_id, outputs))
        # Its cancels are let go of by the I/O thread once the answer has gone (`_send_answers`), not here:
        # after a REREGISTER the id may already name the new scheduler's assignment, cancels and all.
        out.send_multipart([self._tag(batch_id), *frames])

    def _tag(self, batch_id: int) -> bytes:
        return _TAG.pack(batch_id, self._answer_epoch)

    def _take_new(self, batch: RunningBatch, block: bool) -> bool:
        """Admit every assignment and every prepared group that arrived; wait for one when there is
        nothing to run. False: stop."""
        poked = False
        while True:
            try:
                item = self._inbox.get(timeout=0.2) if block else self._inbox.get_nowait()
            except queue.Empty:
                if block and not self._stop.is_set():
                    continue
                return not self._stop.is_set()
            if item is None:
                return False
            if item is _POKE:
                poked = True  # the rest that arrived is taken, then the turn reads what it is told
            elif isinstance(item, Prepared):
                batch.prepared(item)
            elif isinstance(item, Arrival):
                self._arriving = item
                batch.arrive(item)
                self._arriving = None
            elif isinstance(item, Reset):  # what we held is nobody's now: its answers would be discarded
                try:
                    batch.abandon()
                finally:  # even so: answers tagged with the old epoch from now on would all be dropped
                    self._answer_epoch = item.epoch
                with self._lock:
                    self._step = None
            # an assignment joins only once all its groups are ready: until then there may be nothing to do
            block = batch.waiting and not poked

    # ---- I/O side --------------------------------------------------------------------------------------
    def _register_msg(self) -> list[bytes]:
        msg = protocol.RegisterMsg(
            worker_id=self.worker_id,
            capability=self.adapter.capability_dict(),
            capacity=self.capacity,
            memory_budget_bytes=self.memory_budget_bytes,
            device=self.device,
            pid=os.getpid(),
            profile=self.profile,
            conditioning=self.conditioning,
        )
        return protocol.encode(protocol.Kind.REGISTER, msg)

    def serve(self) -> None:
        """Run until WORKER_STOP (other than REREGISTER or LEAVE), stop(), or a leave's LEFT."""
        if self.warmup_shapes and not self.profile:
            from candidate_scheduler.worker.profile import warm_up

            self.profile = warm_up(self.adapter, self.capacity, self.warmup_shapes, self.step_delay_s)
            log.info("warm-up profile: %s", self.profile)
        self._links_open = True
        wake = self.ctx.socket(zmq.PAIR)
        compute = sock = None
        try:  # a failed start (a key directory without keys, an endpoint ZMQ refuses) leaves nothing running
            wake.bind(self._wake_addr)
            compute = threading.Thread(target=self._compute_loop, name="compute", daemon=True)
            compute.start()
            sock = link.connect(self.ctx, self.endpoint, self.worker_id, self.curve_dir)
            self._io_loop(sock, wake, compute)
        finally:
            self._stop.set()
            self._inbox.put(None)
            if compute is not None:
                compute.join(timeout=STOP_WAIT_S)
            if sock is not None:
                sock.close()  # with its LINGER: 0, or a second for LEFT and the last results when leaving
            wake.close(0)
            if compute is None or not compute.is_alive():
                self.ctx.term()  # waits for every socket of the context to close
            else:  # ctx.term would wait for the compute thread's socket, so for its step: left behind
                log.warning("stopped with a step still running after %.0f s: its thread is left behind", STOP_WAIT_S)
        if self.left_reason == COMPUTE_FAILED:
            raise WorkerFailed("the worker's compute thread died (the log has why); it left the scheduler")

    def _io_loop(self, sock, wake, compute: threading.Thread) -> None:
        if self._leave_asked_s is not None or self._stop.is_set():
            return  # told to go during the warm-up or the connect: nobody has heard of us, and nobody should now
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        last_beat = time.monotonic()
        self._register(sock)
        while not self._stop.is_set():
            events = dict(poller.poll(timeout=self._poll_ms()))
            now = time.monotonic()
            if wake in events:
                self._take_answers(wake)
            self._send_answers(sock)  # new ones, and those the link could not take before
            if sock in events:
                if self._on_message(sock, sock.recv_multipart()):
                    return
            if self._leave_asked_s is not None and self._leaving(sock, wake, now):
                return
            # is_alive first: a compute thread that ended because we stop ended after `_stop` was set
            if not compute.is_alive() and not self._stop.is_set():
                log.error("the compute thread died: leaving, so that the scheduler retries what we hold now")
                self._left(sock, wake, COMPUTE_FAILED)
                return
            if not self.registered.is_set():
                if now - self._registered_asked > self.register_timeout_s:
                    self._register(sock)
            elif now - last_beat >= self.heartbeat_interval_s:
                self._beat(sock)
                last_beat = now

    def _poll_ms(self) -> int:
        # a quarter interval, but no longer than 250 ms: stop() and a SIGTERM's leave are read between polls
        return int(min(self.heartbeat_interval_s, 1.0) * 250)

    def _take_answers(self, wake) -> None:
        """Queue every answer the compute thread has finished (it pushes them through `wake`)."""
        while True:
            try:
                tag, *frames = wake.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            batch_id, epoch = _TAG.unpack(tag)
            if epoch == self._epoch:  # else: work of a scheduler that forgot us (`_forget_work`)
                self._outbox.put(batch_id, frames)

    def _send_answers(self, sock) -> None:
        """Send the queued answers the link takes; an assignment is held until its answer has gone."""
        for answered in self._outbox.flush(sock):
            if answered in self._held:
                self._held.remove(answered)
            with self._lock:  # its cancels, those that came in after the compute thread let go of it too
                self._cancelled.pop(answered, None)
            if self._departure is not None:
                self._departure.answered(answered)

    def _on_message(self, sock, frames: list[bytes]) -> bool:
        """Handle one scheduler message; True means stop."""
        try:
            kind, msg = protocol.decode_frames(frames, _FROM_SCHEDULER)
        except protocol.ProtocolError as exc:
            log.warning("ignoring a malformed scheduler message: %s", exc)
            return False
        if kind is protocol.Kind.REGISTERED:
            self.heartbeat_interval_s = heartbeat_interval(msg.heartbeat_interval_s)
            self.registered.set()
            self._unanswered = None
            log.info("registered with %s as %s", self.endpoint, self.worker_id)
        elif kind in (protocol.Kind.BATCH, protocol.Kind.JOIN):
            received_at = time.perf_counter()
            if msg.batch_id in self._held:
                # a second assignment under one id would take the first one's place in the running batch,
                # which then could never answer it nor free its rows
                log.error("ignoring a %s with id %d: we hold an assignment with that id already", kind.name, msg.batch_id)
                return False
            self._held.append(msg.batch_id)
            # decoded here, on the IO thread: the compute thread only steps
            self._inbox.put(arrival_from_wire(msg, kind, received_at))
        elif kind is protocol.Kind.LEAVE_ACK:
            if self._departure is not None and self._departure.owed is None:
                self._departure.acknowledged(msg.batch_ids, self._held)
                with self._lock:  # the scheduler knows we go: hand back what we have not started, if it can take it
                    self._giving_back = msg.give_back
                self._inbox.put(_POKE)
                if self._departure.lost_on_link:
                    log.warning("%d assignment(s) the scheduler sent never arrived; it retries them",
                                self._departure.lost_on_link)
        elif kind is protocol.Kind.CANCEL_ROWS:
            if msg.batch_id in self._held:  # a cancel that crossed the answer would be kept forever
                with self._lock:
                    self._cancelled.setdefault(msg.batch_id, set()).update(msg.request_ids)
                self._inbox.put(_POKE)
        elif kind is protocol.Kind.WORKER_STOP:
            if msg.reason == LEAVE:  # an operator asked the scheduler (`candidate-scheduler worker-leave ID`)
                self._ask_leave()
                return False
            if msg.reason == REREGISTER and self._departure is not None:
                log.info("the scheduler no longer knows us (restarted or shut down): leaving now")
                return True  # it owes nobody our results: what we held was answered or is lost with it
            if msg.reason == REREGISTER:
                # A restarted scheduler answers each heartbeat it got from before with this: one REGISTER
                # for them all (the loop repeats it if unanswered). A second one would arrive after work
                # was assigned, and the scheduler would take it for a restart of this worker.
                if self.registered.is_set():
                    self.registered.clear()
                    self._forget_work()
                    self._register(sock)
            else:
                log.info("scheduler asked us to stop: %s", msg.reason)
                return True
        return False

    def _forget_work(self) -> None:
        """The scheduler forgot us: drop what we hold, unanswered (the module docstring says why)."""
        if self._held:
            log.warning("the scheduler no longer knows us: dropping the %d assignment(s) we held", len(self._held))
        self._epoch += 1
        self._held.clear()
        self._outbox.clear()
        with self._lock:
            self._cancelled.clear()
        self._inbox.put(Reset(self._epoch))  # behind what arrived before it, ahead of what arrives next

    def _register(self, sock) -> None:
        link.try_send(sock, self._register_msg())  # asked again after register_timeout_s if unanswered
        now = self._registered_asked = time.monotonic()
        # A scheduler that is not up yet and one that refuses our keys (CURVE drops the handshake, silently)
        # look alike from here: both leave REGISTER unanswered, and the worker waits for either. Say so.
        if self._unanswered is None:
            self._unanswered = (now, now + self.unanswered_warn_s)
        elif now >= self._unanswered[1]:
            first, _ = self._unanswered
            self._unanswered = (first, now + 6 * self.unanswered_warn_s)
            log.warning("no answer from the scheduler at %s for %.0f s: is it running there? %s", self.endpoint,
                        now - first, "Are this worker's keys (--curve-dir) ones that scheduler takes?"
                        if self.curve_dir else "Does it take keys (then pass --curve-dir)?")

    def _beat(self, sock) -> None:
        """Send a HEARTBEAT. One the link cannot take (the scheduler away a while) is dropped: the next
        lists the same work, and carries the forwards and cache counts this one would have (counters
        the scheduler adds up, so a dropped increment would be missing from them for good)."""
        with self._lock:
            step, forwards = self._step, self._forwards
            self._forwards = []
        held = list(self._held)
        cache = self._cache_counters()
        delta = {} if cache is None else _cache_delta(cache, self._cache_seen)
        beat = protocol.HeartbeatMsg(self.worker_id, held[0] if held else None, step, held, forwards, delta)
        if link.try_send(sock, protocol.encode(protocol.Kind.HEARTBEAT, beat)):
            if cache is not None:
                self._cache_seen = cache
            return
        with self._lock:  # behind the ones run since, and still at most the last _MAX_FORWARD_RECORDS
            self._forwards[:0] = forwards
            del self._forwards[:-_MAX_FORWARD_RECORDS]

    def _cache_counters(self) -> dict[str, int] | None:
        """The conditioning cache's counters now (None: the adapter has none, or they could not be read)."""
        stats = getattr(self.adapter, "cache_stats", None)
        if stats is None:
            return None
        try:
            return {k: int(v) for k, v in stats().items() if k in _CACHE_COUNTERS + ("bytes",)}
        except Exception:  # noqa: BLE001 - on the I/O thread: a metric must not take the worker down
            if not self._cache_failed:  # once, not at every heartbeat
                log.exception("the adapter's conditioning-cache counters could not be read")
            self._cache_failed = True
            return None

    def _leaving(self, sock, wake, now: float) -> bool:
        """Say LEAVING (again while unanswered), then LEFT when `Departure` says we may go; True: go now."""
        if self._departure is None and not self.registered.is_set():
            # not registered yet, or asked to register again: LEFT tells a scheduler that did register us
            # (a REGISTERED still on its way) to forget us now; one that did not ignores it
            return self._left(sock, wake, "unregistered")
        if self._departure is None:
            self._departure = Departure(self._leave_asked_s, now, ack_timeout_s=max(1.0, 2 * self.heartbeat_interval_s))
            self._say_leaving(sock)
            log.info("leaving: no new work; finishing what we hold (grace %.1f s)", self._departure.grace_s)
            return False
        reason = self._departure.outcome(now, holding=bool(self._held))
        if reason is not None:
            return self._left(sock, wake, reason)
        if self._departure.ask_again(now):
            self._say_leaving(sock)
        return False

    def _say_leaving(self, sock) -> None:
        # asked again while unanswered (Departure.ask_again)
        link.try_send(sock, protocol.encode(protocol.Kind.LEAVING, protocol.LeavingMsg(self.worker_id,
                                                                                         self._departure.grace_s)))

    def _left(self, sock, wake, reason: str) -> bool:
        self._take_answers(wake)  # what is finished is answered, not run again elsewhere
        self._send_answers(sock)
        sock.setsockopt(zmq.LINGER, 1000)  # LEFT (and the last results) must leave before the socket closes
        if not link.try_send(sock, protocol.encode(protocol.Kind.LEFT, protocol.LeftMsg(self.worker_id, reason))):
            log.warning("LEFT could not be sent (the scheduler has been unreachable a while): it retries what "
                        "we held when our heartbeats stop")
        self.left_reason = reason
        log.info("left: %s", reason)
        return True

    def leave(self, grace_s: float | None = None) -> None:
        """SIGTERM: go gracefully -- take no new work, finish what we owe within `grace_s` (None: the
        worker's own), then go. A second SIGTERM stops at once (an operator's leave before does not count).
        Safe from a signal handler: it only sets values the I/O loop reads."""
        if self._signalled:
            self.stop()
            return
        self._signalled = True
        self._ask_leave(grace_s)

    def _ask_leave(self, grace_s: float | None = None) -> None:
        if self._leave_asked_s is None:
            self._leave_asked_s = max(0.0, float(self.leave_grace_s if grace_s is None else grace_s))

    def interrupt(self) -> None:
        """SIGINT, from its handler: KeyboardInterrupt before the sockets open (nothing to close), else stop."""
        self.interrupted = True
        if not self._links_open:
            raise KeyboardInterrupt
        self.stop()

    def stop(self) -> None:
        self._stop.set()


def heartbeat_interval(sent: float) -> float:
    """The interval a REGISTERED asks for, within [MIN, MAX]_HEARTBEAT_INTERVAL_S: a worker must not die of (inf
    overflows the poll timeout) nor go silent on a number it was sent. Beating more often is harmless; NaN: default."""
    value = float(sent)
    if math.isnan(value):
        return DEFAULT_HEARTBEAT_INTERVAL_S
    return min(MAX_HEARTBEAT_INTERVAL_S, max(MIN_HEARTBEAT_INTERVAL_S, value))


def _cache_delta(now: dict[str, int], seen: dict[str, int]) -> dict[str, int]:
    """Conditioning-cache counter increments since `seen` (and the bytes in use now)."""
    delta = {k: now[k] - seen.get(k, 0) for k in _CACHE_COUNTERS if k in now}
    return {**{k: v for k, v in delta.items() if v}, "bytes": now.get("bytes", 0)}


CONDITIONING_MODES = ("thread", "inline")
_CACHE_COUNTERS = ("text_hits", "text_misses", "vae_hits", "vae_misses", "evictions")
_FROM_SCHEDULER = frozenset({protocol.Kind.REGISTERED, protocol.Kind.BATCH, protocol.Kind.JOIN,
                             protocol.Kind.CANCEL_ROWS, protocol.Kind.WORKER_STOP, protocol.Kind.LEAVE_ACK})


def build_adapter(kind: str, model_dir: str | None, device: str, capacity: int | None,
                  conditioning_cache_mb: float = 0.0, call_rows: str = "auto"):
    if kind == "null":
        from candidate_scheduler.worker.null_adapter import NullAdapter

        return NullAdapter(capacity or 8)
    if kind == "cosmos3":
        from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

        if model_dir is None:
            raise SystemExit("--model DIR is required for the cosmos3 adapter")
        return Cosmos3CandidateAdapter(model_dir, device=device, max_candidates_per_batch=capacity or 8,
                                       conditioning_cache_mb=conditioning_cache_mb, call_rows=call_rows)
    raise SystemExit(f"unknown adapter {kind!r}")
