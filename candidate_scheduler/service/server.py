"""The scheduler process's IO shell: it reads sockets, calls the engine, and sends what it returns.

Three ROUTER sockets and one thread:

- request socket: SUBMIT (a candidate group) and PING. Each SUBMIT gets exactly one RESULT, or one
  ERROR when the message could not be read at all.
- control socket: CANCEL, STATUS, STATS, DRAIN, SHUTDOWN, COMPAT_REPORT (and PING).
- worker link: workers REGISTER, HEARTBEAT and return BATCH_RESULTs; the shell sends BATCH, JOIN,
  CANCEL_ROWS, REGISTERED and WORKER_STOP.

Every decision is the engine's (core/engine.py); this module decodes, converts (convert.py), passes the
time in, and sends. It is a plain `zmq.Poller` loop rather than asyncio: the engine is synchronous, and
a poll loop saves the event loop's per-send cost on the path of every group. The engine's `tick` runs
every `tick_s` for deadlines, heartbeat timeouts and gauges.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from candidate_scheduler import convert, protocol
from candidate_scheduler.core import messages
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.service.endpoints import bind_socket, is_loopback_endpoint

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_REQUEST_PORT = 5555
DEFAULT_CONTROL_PORT = 5556
DEFAULT_WORKER_PORT = 5557
DEFAULT_COMPAT_PORT = 5558
_BURST = 64  # messages read from one socket before the others get a turn


@dataclass
class SchedulerConfig:
    """Where the scheduler listens; every scheduling knob is the engine's (core/engine.EngineConfig)."""

    request_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_REQUEST_PORT}"
    control_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_CONTROL_PORT}"
    worker_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_WORKER_PORT}"
    metrics_host: str = DEFAULT_HOST
    metrics_port: int | None = 9464  # None: no HTTP exporter
    tick_s: float = 0.05
    curve_dir: str | None = None  # holds server.key_secret and authorized_clients/*.key
    engine: EngineConfig = field(default_factory=EngineConfig)


@dataclass(frozen=True)
class ClientRef:
    """Where a group's reply goes: the ROUTER identity and whether the client used a REQ envelope."""

    identity: bytes
    delimited: bool
    received_at: float = 0.0  # perf_counter() when the shell read the SUBMIT


class Scheduler:
    def __init__(self, config: SchedulerConfig, metrics: Any | None = None, ctx: zmq.Context | None = None):
        self.config = config
        self.engine = Engine(config.engine, metrics,
                             first_batch_id=int.from_bytes(os.urandom(6), "big") + 1,
                             stopwatch=time.perf_counter)
        self.metrics = self.engine.metrics
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stopping = threading.Event()
        self.bound: dict[str, str] = {}
        self._authenticator = None

    # ---- sockets ----------------------------------------------------------------------------------
    def bind(self) -> dict[str, str]:
        def router(endpoint: str, name: str) -> zmq.Socket:
            sock = self.ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
            if name == "worker":
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting worker takes its identity back
                self._secure_worker_link(sock, endpoint)
            self.bound[name] = bind_socket(sock, endpoint)
            return sock

        self.request_sock = router(self.config.request_endpoint, "request")
        self.control_sock = router(self.config.control_endpoint, "control")
        self.worker_sock = router(self.config.worker_endpoint, "worker")
        return dict(self.bound)

    def _secure_worker_link(self, sock, endpoint: str) -> None:
        if self.config.curve_dir is None:
            if not is_loopback_endpoint(endpoint):
                raise RuntimeError(
                    f"refusing to bind the worker link on non-loopback {endpoint} without CURVE keys: "
                    "pass --curve-dir (see `candidate-scheduler keys`)"
                )
            return
        from zmq.auth import load_certificate
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = load_certificate(os.path.join(self.config.curve_dir, "server.key_secret"))
        auth = ThreadAuthenticator(self.ctx)
        auth.start()
        auth.configure_curve(domain="*", location=os.path.join(self.config.curve_dir, "authorized_clients"))
        self._authenticator = auth
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def close(self) -> None:
        # The client-facing sockets linger, and the context is terminated (waiting <= 2 s), so the last
        # replies -- the shutdown answers -- leave before the process exits: LINGER 0 would discard what is
        # still queued, and pyzmq does not terminate contexts at interpreter exit.
        for name in ("request_sock", "control_sock", "worker_sock"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(linger=0 if name == "worker_sock" else 2000)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._owns_ctx:
            self.ctx.destroy(linger=2000)

    # ---- the loop --------------------------------------------------------------------------------------
    def serve(self) -> None:
        poller = zmq.Poller()
        handlers = {self.worker_sock: self._on_worker, self.request_sock: self._on_request,
                    self.control_sock: self._on_control}
        for sock in handlers:
            poller.register(sock, zmq.POLLIN)
        next_tick = time.monotonic()
        try:
            while not self.stopping.is_set():
                timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000.0)
                ready = dict(poller.poll(timeout_ms))
                # Worker results first: they free rows that the submissions behind them can use. The
                # engine plans once after the burst, not after every message: one pass places a burst's
                # groups together (and sends a worker one assignment for them, not one each).
                handled = 0
                for sock, handler in handlers.items():
                    if sock in ready:
                        handled += self._pump(sock, handler)
                if handled:
                    self._run(self.engine.plan, time.monotonic())
                if time.monotonic() >= next_tick:
                    self._run(self.engine.tick, time.monotonic())
                    next_tick = time.monotonic() + self.config.tick_s
        finally:
            # Messages already queued but never read still get their one answer: new groups are refused
            # ("rejected: draining"), control messages answered; then every group in flight.
            self.engine.draining = True
            for sock in (self.request_sock, self.control_sock):
                self._pump(sock, handlers[sock], limit=None)
            self._send_all(self.engine.shutdown(time.monotonic()))
            self.close()

    def _pump(self, sock, handler, limit: int | None = _BURST) -> int:
        """Handle up to `limit` waiting messages of one socket; how many it handled."""
        n = 0
        while limit is None or n < limit:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return n
            n += 1
            try:
                handler(frames)
            except Exception:  # noqa: BLE001 - the loop must outlive any one message
                # The engine answers its own faults (InternalFault); this is the shell's own code.
                log.exception("handler failed; the service keeps serving")
                self.engine.counters["handler_errors"] += 1
                self.metrics.internal_error("shell")
        return n

    def _run(self, event, *args, **kwargs) -> None:
        self._send_all(event(*args, **kwargs))

    def _send_all(self, out: list) -> None:
        for msg in out:
            try:
                self._send(msg)
            except zmq.ZMQError as exc:  # a peer that went away must not take the loop with it
                log.warning("could not send %s: %s", type(msg).__name__, exc)

    def _send(self, msg) -> None:
        if isinstance(msg, messages.Reply):
            ref = msg.client
            result = convert.result_to_wire(msg.result)
            # measured here, around the engine: what a client's round trip cannot separate from its own
            result.metrics["receipt_to_reply_s"] = time.perf_counter() - ref.received_at
            frames = protocol.reply_frames(ref.identity, ref.delimited, protocol.Kind.RESULT, result)
            self.request_sock.send_multipart(frames)
        elif isinstance(msg, messages.SendWork):
            kind, payload = convert.work_to_wire(msg)
            # copied: a zero-copy frame costs a trip through pyzmq's garbage-collector thread, which took
            # more of the scheduler's CPU under load than copying a batch of small observations does
            self.worker_sock.send_multipart([msg.identity, *protocol.encode(kind, payload)])
        elif isinstance(msg, messages.CancelRows):
            payload = protocol.CancelRowsMsg(msg.batch_id, list(msg.request_ids))
            self.worker_sock.send_multipart([msg.identity, *protocol.encode(protocol.Kind.CANCEL_ROWS, payload)])
        elif isinstance(msg, messages.AckRegistration):
            log.info("worker %s registered", msg.worker_id)
            payload = protocol.RegisteredMsg(msg.worker_id, msg.heartbeat_interval_s)
            self.worker_sock.send_multipart([msg.identity, *protocol.encode(protocol.Kind.REGISTERED, payload)])
        elif isinstance(msg, messages.InternalFault):
            log.error("internal error in %s (answered %s internal_error): %s\n%s", msg.event,
                      list(msg.request_ids) or "no group", msg.error, msg.traceback)
        elif isinstance(msg, messages.StopWorker):
            payload = protocol.WorkerStopMsg(reason=msg.reason)
            self.worker_sock.send_multipart([msg.identity, *protocol.encode(protocol.Kind.WORKER_STOP, payload)])
        else:  # pragma: no cover - a new engine message without a sender is a bug
            raise TypeError(f"no sender for {type(msg).__name__}")

    # ---- request socket -----------------------------------------------------------------------------------
    def _on_request(self, frames: list[bytes]) -> None:
        read_at = time.perf_counter()
        read = self._read_client(self.request_sock, "request", frames, protocol.REQUEST_KINDS)
        if read is None:
            return
        identity, delimited, _kind, msg = read
        client, now = ClientRef(identity, delimited, read_at), time.monotonic()
        try:
            sub = convert.submission_from_wire(msg)
        except protocol.ProtocolError as exc:  # an array that cannot be decoded: the request is invalid
            self.metrics.group_received()
            self._run(self.engine.refuse, client, msg.request_id, "invalid", exc.kind, str(exc))
            return
        self._run(self.engine.submit, client, sub, now, plan=False)

    def _read_client(self, sock, socket_name: str, frames: list[bytes], allowed) -> tuple | None:
        """A client's message, read from the request or the control socket: an unreadable one is
        counted and answered ERROR, a PING answered PONG; None when it is answered already."""
        try:
            identity, delimited, kind, msg = _read(frames, allowed)
        except protocol.ProtocolError as exc:
            self.metrics.protocol_error(socket_name, exc.kind)
            self._answer_error(sock, frames, exc)
            return None
        if kind is protocol.Kind.PING:
            sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG, protocol.Pong(msg.nonce)))
            return None
        return identity, delimited, kind, msg

    def _answer_error(self, sock, frames: list[bytes], exc: protocol.ProtocolError) -> None:
        if not frames or len(frames[0]) == 0 or len(frames[0]) > 256:
            return  # no usable identity: nobody to answer
        delimited = len(frames) > 1 and frames[1] == b""
        reply = protocol.ErrorReply(error=str(exc)[:2000], error_code=exc.kind)
        sock.send_multipart(protocol.reply_frames(frames[0], delimited, protocol.Kind.ERROR, reply))

    # ---- worker link ------------------------------------------------------------------------------------------
    def _on_worker(self, frames: list[bytes]) -> None:
        try:
            identity, _delimited, kind, msg = _read(frames, protocol.WORKER_KINDS)
        except protocol.ProtocolError as exc:
            self.metrics.protocol_error("worker", exc.kind)
            return  # a worker that speaks garbage gets no answer; its heartbeats lapse if it is broken
        now = time.monotonic()
        if kind is protocol.Kind.REGISTER:
            self._run(self.engine.register, identity, convert.registration_from_wire(msg), now)
        elif kind is protocol.Kind.HEARTBEAT:
            self._run(self.engine.heartbeat, identity, convert.heartbeat_from_wire(msg), now, plan=False)
        else:
            self._run(self.engine.worker_result, identity, convert.worker_result_from_wire(msg), now, plan=False)

    # ---- control socket ---------------------------------------------------------------------------------------
    def _on_control(self, frames: list[bytes]) -> None:
        read = self._read_client(self.control_sock, "control", frames, protocol.CONTROL_KINDS)
        if read is None:
            return
        identity, delimited, kind, msg = read
        answer, out = self._control(kind, msg)
        reply = protocol.ControlReply(ok=answer.ok, changed=answer.changed, state=answer.state,
                                      detail=dict(answer.detail), error=answer.error)
        self.control_sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY, reply))
        self._send_all(out)
        if kind is protocol.Kind.SHUTDOWN:
            self.stopping.set()

    def _control(self, kind: protocol.Kind, msg) -> tuple[messages.ControlAnswer, list]:
        engine = self.engine
        if kind is protocol.Kind.CANCEL:
            return engine.cancel(msg.request_id, time.monotonic())
        if kind is protocol.Kind.STATUS:
            return engine.status(msg.request_id), []
        if kind is protocol.Kind.STATS:
            return messages.ControlAnswer(ok=True, detail=engine.stats()), []
        if kind is protocol.Kind.DRAIN:
            return engine.drain(), []
        if kind is protocol.Kind.SHUTDOWN:
            return messages.ControlAnswer(ok=True, changed=True, state="stopping",
                                          detail={"in_flight": len(engine.groups)}), []
        if kind is protocol.Kind.COMPAT_REPORT:
            # bounded: each count is capped so a hostile report cannot spin the loop
            for name, n in msg.requests.items():
                self.metrics.compat_request(name, max(0, min(int(n), 100_000)))
            for name, n in msg.errors.items():
                self.metrics.protocol_error("compat", name, max(0, min(int(n), 100_000)))
            return messages.ControlAnswer(ok=True), []
        return messages.ControlAnswer(ok=False, error=f"unsupported control kind {kind.name}"), []


def _read(frames: list[bytes], allowed) -> tuple[bytes, bool, protocol.Kind, Any]:
    """split_envelope + decode: every unreadable message is a ProtocolError."""
    identity, delimited, kind, payload = protocol.split_envelope(frames, allowed)
    return identity, delimited, kind, protocol.decode(kind, payload)
