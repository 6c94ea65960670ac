"""The worker process: one DEALER to the scheduler's worker link, one model adapter, a running batch.

Two threads, so heartbeats and cancels keep flowing while the model computes:

- the I/O thread owns the ZMQ DEALER: it registers, sends heartbeats (listing every assignment it holds
  and the forwards run since the last one), receives BATCH and JOIN (decoded there and handed to the
  compute thread, which admits them as its rows allow: running.py) and
  CANCEL_ROWS (recorded in a lock-guarded map the compute thread reads at each step boundary), and
  forwards results that the compute thread pushes through an inproc PAIR (so a result leaves at once,
  not at the next poll tick);
- the compute thread owns the running batch (running.py): at every step boundary it admits the
  assignments that arrived, drops cancelled groups, runs one denoise step of everything running, and
  answers each assignment as soon as all its groups are done -- a short group never waits for a long one;
- with an adapter that allows it (and `conditioning="thread"`, the default), the conditioning thread
  (preparing.py) starts the groups that arrive while others run, so a joiner's VAE encode and text
  pathway never stall the groups already running; started groups come back through the compute thread's
  inbox. With nothing running, the compute thread starts them itself (running.py says why).

If the scheduler forgets us (restart, or it declared us dead), it answers WORKER_STOP("reregister")
and we register again; ZMQ reconnects the TCP link by itself.

`leave(grace_s)` (SIGTERM, or WORKER_STOP("leave") when an operator asks the scheduler) goes
gracefully: LEAVING, finish what the scheduler says we owe, LEFT (leaving.py). A second SIGTERM, or
`stop()`, stops at once.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid

import zmq

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.messages import LEAVE, REREGISTER
from candidate_scheduler.worker.leaving import Departure
from candidate_scheduler.worker.preparing import Prepared, Preparer, supports_concurrent_start
from candidate_scheduler.worker.running import Arrival, RunningBatch, arrival_from_wire
from candidate_scheduler.worker.stepping import StepAdapter

log = logging.getLogger("candidate_scheduler.worker")

_MAX_FORWARD_RECORDS = 1024  # per heartbeat; older ones are dropped rather than growing without bound


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
        self.heartbeat_interval_s = 0.5
        self.ctx = zmq.Context()
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # guards _cancelled, _giving_back, _forwards and _step
        self._cancelled: dict[int, set[str]] = {}
        self._giving_back = False  # leaving, and the scheduler knows: hand back what has not started
        self._forwards: list[tuple[int, float, str]] = []
        self._step: int | None = None
        self._held: list[int] = []  # assignment ids received and not yet answered (I/O thread only)
        self._cache_seen: dict[str, int] = {}
        self._stop = threading.Event()
        self.leave_grace_s = leave_grace_s  # how long a leave (SIGTERM, or an operator's) waits for what it holds
        self._leave_asked_s: float | None = None  # a leave was asked, with this grace (the I/O thread acts on it)
        self._signalled = False  # a SIGTERM asked it: a second one stops at once
        self._departure: Departure | None = None  # LEAVING sent: when we may go (I/O thread only)
        self.left_reason: str | None = None  # why we went, once LEFT is sent
        self.registered = threading.Event()
        self._registered_asked = 0.0  # when the last REGISTER went out
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
                # nothing to run or answer: wait for an assignment, or a group the preparer is starting
                if not self._take_new(batch, block=batch.waiting):
                    return
                with self._lock:
                    cancelled = {k: set(v) for k, v in self._cancelled.items()}
                    giving_back = self._giving_back
                batch.drop(cancelled)
                if giving_back:  # leaving: what waits for our rows is run elsewhere now
                    batch.leaving = True  # and nothing more is conditioned early, only to be given back
                    for batch_id in batch.give_back():
                        msg = protocol.GiveBackMsg(self.worker_id, [batch_id])
                        out.send_multipart([batch_id.to_bytes(8, "big"), *protocol.encode(protocol.Kind.GIVE_BACK, msg)])
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
                for a in batch.take_done():
                    outputs = [a.outputs[i] for i in range(len(a.items))]
                    if self._mangle is not None:
                        outputs = self._mangle([it for it in a.items if it is not None], outputs)
                    try:
                        result = protocol.BatchResultMsg(self.worker_id, a.batch_id,
                                                         [convert.output_to_wire(o) for o in outputs], a.wire_report())
                        frames = protocol.encode(protocol.Kind.BATCH_RESULT, result)
                    except Exception as exc:  # noqa: BLE001 - an unencodable result still gets an answer
                        log.exception("assignment %d could not be encoded", a.batch_id)
                        outputs = [protocol.GroupOutputMsg(o.request_id, "error", error=f"{type(exc).__name__}: {exc}",
                                                           error_code="worker_error") for o in outputs]
                        frames = protocol.encode(protocol.Kind.BATCH_RESULT,
                                                 protocol.BatchResultMsg(self.worker_id, a.batch_id, outputs))
                    with self._lock:
                        self._cancelled.pop(a.batch_id, None)
                    out.send_multipart([a.batch_id.to_bytes(8, "big"), *frames])
                if batch.idle:
                    with self._lock:
                        self._step = None
        finally:
            if preparer is not None:
                preparer.close()
            out.close(0)

    def _take_new(self, batch: RunningBatch, block: bool) -> bool:
        """Admit every assignment and every prepared group that arrived; wait for one when there is
        nothing to run. False: stop."""
        while True:
            try:
                item = self._inbox.get(timeout=0.2) if block else self._inbox.get_nowait()
            except queue.Empty:
                if block and not self._stop.is_set():
                    continue
                return not self._stop.is_set()
            if item is None:
                return False
            if isinstance(item, Prepared):
                batch.prepared(item)
            elif isinstance(item, Arrival):
                batch.arrive(item)
            # an assignment joins only once all its groups are ready: until then there may be nothing to do
            block = batch.waiting

    # ---- I/O side --------------------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, self.worker_id.encode())
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self.curve_dir is not None:
            from zmq.auth import load_certificate

            pub, sec = load_certificate(os.path.join(self.curve_dir, "client.key_secret"))
            server_pub, _ = load_certificate(os.path.join(self.curve_dir, "server.key"))
            sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = pub, sec, server_pub
        sock.connect(self.endpoint)
        return sock

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
        wake = self.ctx.socket(zmq.PAIR)
        wake.bind(self._wake_addr)
        compute = threading.Thread(target=self._compute_loop, name="compute", daemon=True)
        compute.start()
        sock = self._socket()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        last_beat = time.monotonic()
        try:
            if self._leave_asked_s is not None:
                return  # told to go during the warm-up: nobody has heard of us, and nobody should now
            self._register(sock)
            while not self._stop.is_set():
                events = dict(poller.poll(timeout=int(self.heartbeat_interval_s * 250)))
                now = time.monotonic()
                if wake in events:
                    self._forward_results(wake, sock)
                if sock in events:
                    if self._on_message(sock, sock.recv_multipart()):
                        return
                if self._leave_asked_s is not None and self._leaving(sock, wake, now):
                    return
                if not self.registered.is_set():
                    if now - self._registered_asked > self.register_timeout_s:
                        self._register(sock)
                elif now - last_beat >= self.heartbeat_interval_s:
                    sock.send_multipart(protocol.encode(protocol.Kind.HEARTBEAT, self._heartbeat()))
                    last_beat = now
        finally:
            self._stop.set()
            self._inbox.put(None)
            compute.join(timeout=5)
            sock.close()  # with its LINGER: 0, or a second for LEFT and the last results when leaving
            wake.close(0)
            self.ctx.term()

    def _forward_results(self, wake, sock) -> None:
        """Send on every result the compute thread has finished (it pushes them through `wake`)."""
        while True:
            try:
                batch_id, *frames = wake.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            answered = int.from_bytes(batch_id, "big")
            if answered in self._held:  # answered: no longer held
                self._held.remove(answered)
            with self._lock:  # with a cancel that came in after the compute thread let go of it
                self._cancelled.pop(answered, None)
            sock.send_multipart(frames)
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
            self.heartbeat_interval_s = max(0.05, float(msg.heartbeat_interval_s))
            self.registered.set()
            log.info("registered with %s as %s", self.endpoint, self.worker_id)
        elif kind in (protocol.Kind.BATCH, protocol.Kind.JOIN):
            received_at = time.perf_counter()
            self._held.append(msg.batch_id)
            # decoded here, on the IO thread: the compute thread only steps
            self._inbox.put(arrival_from_wire(msg, kind, received_at))
        elif kind is protocol.Kind.LEAVE_ACK:
            if self._departure is not None and self._departure.owed is None:
                self._departure.acknowledged(msg.batch_ids, self._held)
                with self._lock:  # the scheduler knows we go: hand back what we have not started, if it can take it
                    self._giving_back = msg.give_back
                if self._departure.lost_on_link:
                    log.warning("%d assignment(s) the scheduler sent never arrived; it retries them",
                                self._departure.lost_on_link)
        elif kind is protocol.Kind.CANCEL_ROWS:
            if msg.batch_id in self._held:  # a cancel that crossed the answer would be kept forever
                with self._lock:
                    self._cancelled.setdefault(msg.batch_id, set()).update(msg.request_ids)
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
                    self._register(sock)
            else:
                log.info("scheduler asked us to stop: %s", msg.reason)
                return True
        return False

    def _register(self, sock) -> None:
        sock.send_multipart(self._register_msg())
        self._registered_asked = time.monotonic()

    def _heartbeat(self) -> protocol.HeartbeatMsg:
        with self._lock:
            step, forwards = self._step, self._forwards
            self._forwards = []
        held = list(self._held)
        return protocol.HeartbeatMsg(self.worker_id, held[0] if held else None, step, held, forwards, self._cache_delta())

    def _cache_delta(self) -> dict[str, int]:
        """Conditioning-cache counter increments since the last heartbeat (and the bytes in use now)."""
        stats = getattr(self.adapter, "cache_stats", None)
        if stats is None:
            return {}
        now = {k: int(v) for k, v in stats().items() if k in _CACHE_COUNTERS + ("bytes",)}
        delta = {k: now[k] - self._cache_seen.get(k, 0) for k in _CACHE_COUNTERS if k in now}
        self._cache_seen = now
        return {**{k: v for k, v in delta.items() if v}, "bytes": now.get("bytes", 0)}

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
        sock.send_multipart(protocol.encode(protocol.Kind.LEAVING, protocol.LeavingMsg(self.worker_id,
                                                                                       self._departure.grace_s)))

    def _left(self, sock, wake, reason: str) -> bool:
        self._forward_results(wake, sock)  # what is finished is answered, not run again elsewhere
        sock.setsockopt(zmq.LINGER, 1000)  # LEFT (and the last results) must leave before the socket closes
        sock.send_multipart(protocol.encode(protocol.Kind.LEFT, protocol.LeftMsg(self.worker_id, reason)))
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

    def stop(self) -> None:
        self._stop.set()


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
