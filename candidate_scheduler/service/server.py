"""The scheduler process's IO shell: it reads sockets, calls the engine, and sends what it returns.

Three ROUTER sockets and one thread:

- request socket: SUBMIT (a candidate group) and PING. Each SUBMIT gets exactly one RESULT, or one
  ERROR when the message could not be read at all.
- control socket: CANCEL, STATUS, STATS, DRAIN, SHUTDOWN, COMPAT_REPORT (and PING).
- worker link: workers REGISTER, HEARTBEAT and return BATCH_RESULTs; the shell sends BATCH, JOIN,
  CANCEL_ROWS, REGISTERED and WORKER_STOP.

`stop(grace_s)` (SIGTERM) stops gracefully: nothing new is admitted (`rejected` / `stopping`) and the loop
runs on until the groups admitted are answered, the grace runs out, or no worker is left to serve them
(core/graceful_stop.py); `stop_now` (SIGINT, SHUTDOWN, a second SIGTERM) ends the loop at once. Either
way the loop's end answers every group still in flight, once.

Every decision is the engine's (core/engine.py); this module decodes, converts (convert.py), passes the
time in, and sends. It is a plain `zmq.Poller` loop rather than asyncio: the engine is synchronous, and
a poll loop saves the event loop's per-send cost on the path of every group. The engine's `tick` runs
every `tick_s` for deadlines, heartbeat timeouts and gauges; a planning pass also runs at the engine's
`wake_at`, when a worker becomes due for the work it will hold next (late prefetch).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from candidate_scheduler import convert, protocol
from candidate_scheduler.core import messages
from candidate_scheduler.core.access import (
    DEFAULT_TENANT,
    FORBIDDEN,
    LOCAL,
    Action,
    Principal,
    Role,
    acting_for,
    check_name,
    denied,
)
from candidate_scheduler.core.endings import REPLY_TOO_LARGE, REPLY_TOO_LARGE_HINT
from candidate_scheduler.core.engine import INTERNAL_ERROR, Engine, EngineConfig
from candidate_scheduler.core.graceful_stop import GracefulStop, Verdict, serving_workers
from candidate_scheduler.core.group import refusal
from candidate_scheduler.core.request_scope import scoped_id
from candidate_scheduler.service.endpoints import bind_socket, ipv6_for, is_loopback_endpoint, is_loopback_host
from candidate_scheduler.service.keys import CLIENTS_DOMAIN, WORKERS_DOMAIN, Authenticator, ClientKeys, Directory

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_REQUEST_PORT = 5555
DEFAULT_CONTROL_PORT = 5556
DEFAULT_WORKER_PORT = 5557
DEFAULT_COMPAT_PORT = 5558
_BURST = 64  # messages read from one socket before the others get a turn
# What a reply's arrays may weigh: the message limit, less room for its other fields (seeds, metrics, an
# error text: kilobytes). Over it the engine fails the group, and counts it so; `_send` still checks the
# encoded bytes, for a reply that would slip between the two.
REPLY_ARRAY_LIMIT = protocol.MAX_MESSAGE_BYTES - 2**20


@dataclass
class SchedulerConfig:
    """Where the scheduler listens; every scheduling knob is the engine's (core/engine.EngineConfig)."""

    request_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_REQUEST_PORT}"
    control_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_CONTROL_PORT}"
    worker_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_WORKER_PORT}"
    metrics_host: str = DEFAULT_HOST
    metrics_port: int | None = 9464  # None: no HTTP exporter
    tick_s: float = 0.05
    curve_dir: str | None = None  # the key directory (service/keys.py): with it, every socket needs a key
    insecure: bool = False  # the user said --insecure: sockets off loopback without keys are allowed
    engine: EngineConfig = field(default_factory=EngineConfig)


class StartupRefused(RuntimeError):
    """The scheduler will not start as configured; the message is one line that says the fix."""


# the right each control message needs (core/access.py); PING is answered before any is asked
CONTROL_ACTIONS = {protocol.Kind.CANCEL: Action.CANCEL, protocol.Kind.STATUS: Action.STATUS,
                   protocol.Kind.STATS: Action.STATS, protocol.Kind.DRAIN: Action.DRAIN,
                   protocol.Kind.SHUTDOWN: Action.SHUTDOWN, protocol.Kind.COMPAT_REPORT: Action.COMPAT_REPORT,
                   protocol.Kind.WORKER_LEAVE: Action.WORKER_LEAVE}


@dataclass(frozen=True)
class ClientRef:
    """Where a group's reply goes: the ROUTER identity and whether the client used a REQ envelope."""

    identity: bytes
    delimited: bool
    # perf_counter() when the shell read the SUBMIT. Not compared: two SUBMITs from one connection are one
    # destination, so a resubmission on it waits without a second copy of the reply (core/intake.py).
    received_at: float = field(default=0.0, compare=False)
    # the request id the SUBMIT carried, which its reply carries back (the engine keys the group by a scoped
    # id under keys: core/request_scope.py); not compared, as received_at
    request_id: str | None = field(default=None, compare=False)


class Scheduler:
    def __init__(self, config: SchedulerConfig, metrics: Any | None = None, ctx: zmq.Context | None = None):
        self.config = config
        self.engine = Engine(config.engine, metrics,
                             first_batch_id=int.from_bytes(os.urandom(6), "big") + 1,
                             stopwatch=time.perf_counter, reply_limit_bytes=REPLY_ARRAY_LIMIT)
        self.incarnation = os.urandom(8).hex()  # said in every PONG (protocol.Pong)
        self.metrics = self.engine.metrics
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stop_now = threading.Event()  # set: the loop ends at once (SIGINT, SHUTDOWN, a second SIGTERM)
        self.graceful: GracefulStop | None = None  # a stop asked with a grace (SIGTERM), once the loop took it up
        self._stop_asked: tuple[float, float] | None = None  # (when, grace_s), set by `stop` from a signal handler
        self.bound: dict[str, str] = {}
        self.insecure_sockets: list[str] = []  # bound off loopback without keys, under --insecure
        self.unkeyed_local: list[str] = []  # on loopback without keys while the rest takes them (compat)
        self.directory: Directory | None = None
        self._authenticator: Authenticator | None = None
        self._server_public: bytes | None = None

    # ---- sockets ----------------------------------------------------------------------------------
    def bind(self) -> dict[str, str]:
        """Bind the three sockets; StartupRefused (nothing bound) when one would be open off loopback
        without keys and the user did not say --insecure."""
        endpoints = {"request": self.config.request_endpoint, "control": self.config.control_endpoint,
                     "worker": self.config.worker_endpoint}
        public = [name for name, ep in endpoints.items() if not is_loopback_endpoint(ep)]
        if self.config.curve_dir is None and public and not self.config.insecure:
            raise StartupRefused(
                f"refusing to bind the {_names(public)} socket{'s' if len(public) > 1 else ''} off loopback "
                f"({', '.join(endpoints[n] for n in public)}) without CURVE keys: pass --curve-dir DIR "
                "(`candidate-scheduler keys DIR` writes one), or --insecure to let anyone who can reach them in")
        if self.config.curve_dir is not None:
            self._start_authenticator(self.config.curve_dir)
        elif public:
            self.insecure_sockets = public
            log.warning("INSECURE: the %s socket(s) listen off loopback without authentication (--insecure)",
                        ", ".join(public))

        def router(name: str) -> zmq.Socket:
            sock = ipv6_for(self.ctx.socket(zmq.ROUTER), endpoints[name])
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
            if name == "worker":
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting worker takes its identity back
            if self._authenticator is not None:
                sock.zap_domain = (WORKERS_DOMAIN if name == "worker" else CLIENTS_DOMAIN).encode()
                # without it libzmq admits any key when no ZAP handler answers (one gone, or not yet started)
                sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
                sock.curve_secretkey = self._server_secret
                sock.curve_publickey = self._server_public
                sock.curve_server = True
            try:
                self.bound[name] = bind_socket(sock, endpoints[name])
            except zmq.ZMQError as exc:  # a port in use, an address not on this host: the user's to fix
                sock.close(linger=0)
                raise StartupRefused(f"cannot listen on {endpoints[name]} (the {name} socket): {exc}") from exc
            return sock

        self.request_sock = router("request")
        self.control_sock = router("control")
        self.worker_sock = router("worker")
        return dict(self.bound)

    def _start_authenticator(self, curve_dir: str) -> None:
        from zmq.auth import load_certificate

        try:
            self._server_public, self._server_secret = load_certificate(os.path.join(curve_dir, "server.key_secret"))
            self.directory = Directory.load(curve_dir)
        except (OSError, ValueError) as exc:
            raise StartupRefused(f"cannot use the key directory {curve_dir}: {exc} "
                                 f"(`candidate-scheduler keys {curve_dir}` writes one)") from exc
        auth = Authenticator(self.ctx, self.directory)
        auth.start_for_domains()
        self._authenticator = auth

    def note_compat(self, host: str) -> None:
        """The sglang compat socket serve starts beside it: pickle, no keys. Shown in stats: off loopback
        (only under --insecure) it is one of the insecure sockets; on loopback under keys, the one local
        way in that takes no key."""
        if not is_loopback_host(host):
            self.insecure_sockets.append("compat")
        elif self.secure:
            self.unkeyed_local.append("compat")

    def use_metrics(self, metrics: Any | None) -> None:
        """The metrics sink, made once the tenants it labels are known (bind reads the key directory)."""
        if metrics is not None:
            self.engine.metrics = self.metrics = metrics

    @property
    def secure(self) -> bool:
        return self._authenticator is not None

    def proxy_keys(self, name: str) -> ClientKeys | None:
        """A run-time key pair for a front this process starts (the openpi websocket, the sglang bridge),
        authorised in memory as a proxy principal; None when the sockets take no keys."""
        if self._authenticator is None:
            return None
        keys = ClientKeys.ephemeral(self._server_public)
        self._authenticator.admit(Principal(name, DEFAULT_TENANT, Role.PROXY), keys.public)
        return keys

    def tenant_names(self) -> list[str]:
        return [] if self.directory is None else self.directory.tenants()

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
            while not self.stop_now.is_set():
                if self._stop_asked is not None and self._carry_out_stop():
                    break
                # the engine may ask for a planning pass sooner: a worker becomes due for prefetched work
                wake = next_tick if self.engine.wake_at is None else min(next_tick, self.engine.wake_at)
                if self.graceful is not None:
                    wake = min(wake, self.graceful.until)
                # rounded up: a poll that returns before `wake` would spin until it comes
                timeout_ms = max(0, math.ceil((wake - time.monotonic()) * 1000.0))
                ready = dict(poller.poll(timeout_ms))
                # Worker results first: they free rows that the submissions behind them can use. The
                # engine plans once after the burst, not after every message: one pass places a burst's
                # groups together (and sends a worker one assignment for them, not one each).
                handled = 0
                for sock, handler in handlers.items():
                    if sock in ready:
                        handled += self._pump(sock, handler)
                wake = self.engine.wake_at
                if handled or (wake is not None and time.monotonic() >= wake):
                    self._guarded(self.engine.plan, time.monotonic())
                if time.monotonic() >= next_tick:
                    # Every worker message already here is read before heartbeats are judged: after a stall,
                    # beats queued behind the burst limit (a fleet of more than _BURST workers) would have made
                    # live workers look dead, and their slices retried, each retry an attempt.
                    if self._pump(self.worker_sock, self._on_worker, limit=None):
                        self._guarded(self.engine.plan, time.monotonic())
                    self._guarded(self.engine.tick, time.monotonic())
                    next_tick = time.monotonic() + self.config.tick_s
        finally:
            # Messages already queued but never read still get their one answer: new groups are refused
            # ("rejected: stopping"), control messages answered; then every group in flight.
            self.engine.draining = self.engine.stopping = True
            for sock in (self.request_sock, self.control_sock):
                self._pump(sock, handlers[sock], limit=None)
            self._send_all(self.engine.shutdown(time.monotonic()))
            self.close()

    # ---- stopping ---------------------------------------------------------------------------------------
    def stop(self, grace_s: float) -> None:
        """Stop gracefully (what SIGTERM does, core/graceful_stop.py): admit nothing new, serve what is in
        flight for up to `grace_s`, then stop as `stop_now` does. A second call, or a grace of 0, stops at
        once. Safe in a signal handler: it only notes the request; the loop carries it out."""
        if self._stop_asked is not None or grace_s <= 0:
            self.stop_now.set()
        else:
            self._stop_asked = (time.monotonic(), grace_s)

    def _carry_out_stop(self) -> bool:
        """Whether the loop must stop now: a graceful stop whose groups are all answered, whose grace ran
        out, or with no worker left to serve them (core/graceful_stop.py)."""
        if self.graceful is None:
            began, grace_s = self._stop_asked
            self.graceful = GracefulStop(began, grace_s)
            self.engine.draining = self.engine.stopping = True  # no new group from here on
            log.warning("stopping: serving the %d group(s) in flight for up to %.1f s, admitting no new ones "
                        "(a second SIGTERM or SIGINT stops at once)", len(self.engine.groups), grace_s)
        workers = serving_workers(self.engine.workers, self.engine.leaving.values())
        verdict = self.graceful.verdict(time.monotonic(), len(self.engine.groups), workers)
        if verdict is Verdict.SERVE:
            return False
        if verdict is Verdict.FINISHED:
            log.warning("stopping: every group answered, %.1f s after the stop was asked",
                        time.monotonic() - self.graceful.began)
        elif verdict is Verdict.NO_WORKERS:
            log.warning("stopping: no worker left to serve the %d group(s) in flight; they are answered "
                        "shutting_down", len(self.engine.groups))
        else:
            log.warning("stopping: the %.1f s grace ran out; %d group(s) in flight are answered shutting_down",
                        self.graceful.grace_s, len(self.engine.groups))
        return True

    def _pump(self, sock, handler, limit: int | None = _BURST) -> int:
        """Handle up to `limit` waiting messages of one socket; how many it handled."""
        # on a client socket under CURVE, each message names its sender (ZAP's User-Id, service/keys.py)
        named = self.secure and sock is not self.worker_sock
        n = 0
        while limit is None or n < limit:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=not named)
            except zmq.Again:
                return n
            n += 1
            try:
                principal = LOCAL
                if named:
                    principal = self._principal(frames[-1].get("User-Id"))
                    frames = [f.bytes for f in frames]
                handler(frames, principal)
            except Exception:  # noqa: BLE001 - the loop must outlive any one message
                # The engine answers its own faults (InternalFault); this is the shell's own code.
                log.exception("handler failed; the service keeps serving")
                self.engine.counters["handler_errors"] += 1
                self.metrics.internal_error("shell")
        return n

    def _principal(self, user_id: str) -> Principal:
        principal = self.directory.get(user_id) if self.directory is not None else None
        if principal is None:  # ZAP admitted only keys it knows: a bug, never a caller's doing
            raise RuntimeError(f"a message from an unknown principal {user_id!r}")
        return principal

    def _run(self, event, *args, **kwargs) -> None:
        self._send_all(event(*args, **kwargs))

    def _guarded(self, event, *args) -> None:
        """An event of the loop's own (a planning pass, a tick): the engine answers its own faults, so what
        raises here is the shell's; counted, and the loop goes on."""
        try:
            self._run(event, *args)
        except Exception:  # noqa: BLE001 - the loop must outlive it
            log.exception("the shell failed in %s; the service keeps serving", getattr(event, "__name__", event))
            self.engine.counters["handler_errors"] += 1
            self.metrics.internal_error("shell")

    def _send_all(self, out: list) -> None:
        for msg in out:
            try:
                self._send(msg)
            except zmq.ZMQError as exc:  # a peer that went away must not take the loop with it
                log.warning("could not send %s: %s", type(msg).__name__, exc)
            except Exception as exc:  # noqa: BLE001 - one message that cannot be encoded; the rest still go
                log.exception("could not encode %s; the service keeps serving", type(msg).__name__)
                self.engine.counters["handler_errors"] += 1
                self.metrics.internal_error("shell")
                if isinstance(msg, messages.Reply):  # its group is answered all the same, once
                    self._send_fallback(msg, exc)

    def _send_fallback(self, msg: messages.Reply, exc: Exception) -> None:
        rid = msg.result.request_id
        text = f"internal error while sending the reply: {type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            self._send(messages.Reply(msg.client, refusal(rid, "failed", INTERNAL_ERROR, text)))

    def _send(self, msg) -> None:
        if isinstance(msg, messages.Reply):
            ref = msg.client
            result = convert.result_to_wire(msg.result, ref.request_id)
            # measured here, around the engine: what a client's round trip cannot separate from its own
            result.metrics["receipt_to_reply_s"] = time.perf_counter() - ref.received_at
            frames = protocol.reply_frames(ref.identity, ref.delimited, protocol.Kind.RESULT, result)
            size = sum(len(f) for f in frames[1:])
            if size > protocol.MAX_MESSAGE_BYTES:  # the client's socket would drop it, and with it its connection,
                # for good (libzmq does not reconnect after a protocol error): a typed failure instead
                big = refusal(msg.result.request_id, "failed", REPLY_TOO_LARGE,
                              f"the reply is {size} bytes, over the {protocol.MAX_MESSAGE_BYTES}-byte message limit: "
                              + REPLY_TOO_LARGE_HINT)
                frames = protocol.reply_frames(ref.identity, ref.delimited, protocol.Kind.RESULT,
                                               convert.result_to_wire(big, ref.request_id))
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
        elif isinstance(msg, messages.AckLeaving):
            log.info("a worker is leaving; it owes %d assignment(s)", len(msg.batch_ids))
            payload = protocol.LeaveAckMsg(list(msg.batch_ids), give_back=True)
            self.worker_sock.send_multipart([msg.identity, *protocol.encode(protocol.Kind.LEAVE_ACK, payload)])
        elif isinstance(msg, messages.StopWorker):
            payload = protocol.WorkerStopMsg(reason=msg.reason)
            self.worker_sock.send_multipart([msg.identity, *protocol.encode(protocol.Kind.WORKER_STOP, payload)])
        else:  # pragma: no cover - a new engine message without a sender is a bug
            raise TypeError(f"no sender for {type(msg).__name__}")

    # ---- request socket -----------------------------------------------------------------------------------
    def _on_request(self, frames: list[bytes], sender: Principal) -> None:
        read_at = time.perf_counter()
        read = self._read_client(self.request_sock, "request", frames, protocol.REQUEST_KINDS)
        if read is None:
            return
        identity, delimited, _kind, msg = read
        client, now = ClientRef(identity, delimited, read_at, msg.request_id), time.monotonic()
        lookup = self.directory.token_holder if self.directory is not None else (lambda _name: None)
        principal, why = acting_for(sender, msg.on_behalf, lookup)
        why = why or denied(principal, Action.SUBMIT)
        if why is not None:
            self._refuse_submit(client, msg, principal.tenant, "rejected", FORBIDDEN, why)
            return self._record(self.metrics.forbidden, Action.SUBMIT.value)
        via = sender.name if principal is not sender else None
        try:
            sub = convert.submission_from_wire(msg, self._scope(sender))
        except protocol.ProtocolError as exc:  # an array that cannot be decoded: the request is invalid
            return self._refuse_submit(client, msg, principal.tenant, "invalid", exc.kind, str(exc))
        except Exception as exc:  # noqa: BLE001 - the shell's own fault: still one answer for the SUBMIT
            log.exception("could not read the SUBMIT of %r", msg.request_id)
            self.engine.counters["handler_errors"] += 1  # as every fault of the shell's: STATS and the metric agree
            self.metrics.internal_error("shell")
            return self._refuse_submit(client, msg, principal.tenant, "failed", INTERNAL_ERROR,
                                       f"internal error while reading the request: {type(exc).__name__}: {exc}")
        # a resubmission under this id must be the same request (core/resubmission.py): its bytes' digest.
        # SHA-256 (truncated): on CPUs with the SHA extensions (x86 since Intel Ice Lake and AMD Zen) it is
        # 2.4x faster than BLAKE2b (85 against 205 us for a 150 KB observation here); on older ones slower
        fingerprint = hashlib.sha256(frames[-1]).digest()[:16]
        self._run(self.engine.submit, client, sub, now, plan=False, principal=principal, via=via,
                  fingerprint=fingerprint)

    def _refuse_submit(self, client: ClientRef, msg: protocol.SubmitRequest, tenant: str, status: str, code: str,
                       message: str) -> None:
        """A SUBMIT refused before the engine sees it: counted as received (by its API) and answered, for
        the sender's tenant, as the engine's own refusals are."""
        self._record(self.metrics.group_received, msg.api)
        self._run(self.engine.refuse, client, msg.request_id, status, code, message, tenant=tenant)

    def _record(self, metric, *args) -> None:
        """A metric the shell records beside an answer: one that raises is logged and counted, and the answer
        still goes (a SUBMIT refused here, or a forbidden control request, was left to its client's timeout)."""
        try:
            metric(*args)
        except Exception:  # noqa: BLE001 - a metrics backend's fault must not cost a client its answer
            log.exception("recording a metric failed; the service keeps serving")
            self.engine.counters["handler_errors"] += 1

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
            pong = protocol.Pong(msg.nonce, incarnation=self.incarnation)
            sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG, pong))
            return None
        return identity, delimited, kind, msg

    def _answer_error(self, sock, frames: list[bytes], exc: protocol.ProtocolError) -> None:
        if not frames or len(frames[0]) == 0 or len(frames[0]) > 256:
            return  # no usable identity: nobody to answer
        delimited = len(frames) > 1 and frames[1] == b""
        reply = protocol.ErrorReply(error=str(exc)[:2000], error_code=exc.kind,
                                    request_id=protocol.request_id_of(frames[-1]) if len(frames) > 2 else None)
        sock.send_multipart(protocol.reply_frames(frames[0], delimited, protocol.Kind.ERROR, reply))

    # ---- worker link ------------------------------------------------------------------------------------------
    def _on_worker(self, frames: list[bytes], _principal: Principal) -> None:
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
        elif kind is protocol.Kind.LEAVING:
            log.info("worker %s is leaving (grace %.1f s)", msg.worker_id, msg.grace_s)
            self._run(self.engine.worker_leaving, identity, messages.Leaving(msg.worker_id, msg.grace_s), now,
                      plan=False)
        elif kind is protocol.Kind.LEFT:
            log.info("worker %s left: %s", msg.worker_id, msg.reason)
            self._run(self.engine.worker_left, identity, messages.Left(msg.worker_id, msg.reason), now, plan=False)
        elif kind is protocol.Kind.GIVE_BACK:
            log.info("worker %s gave back %d assignment(s) it had not started", msg.worker_id, len(msg.batch_ids))
            self._run(self.engine.worker_gave_back, identity, messages.GiveBack(msg.worker_id, tuple(msg.batch_ids)),
                      now, plan=False)
        else:
            self._run(self.engine.worker_result, identity, convert.worker_result_from_wire(msg), now, plan=False)

    # ---- control socket ---------------------------------------------------------------------------------------
    def _on_control(self, frames: list[bytes], principal: Principal) -> None:
        read = self._read_client(self.control_sock, "control", frames, protocol.CONTROL_KINDS)
        if read is None:
            return
        identity, delimited, kind, msg = read
        action = CONTROL_ACTIONS.get(kind)
        # an action outside the role is refused here (whose group it is, the engine checks); a control
        # message no right covers is refused to everyone rather than let through
        why = f"no right covers {kind.name}" if action is None else denied(principal, action)
        if why is not None:
            self._record(self.metrics.forbidden, action.value if action is not None else "other")
            answer, out = messages.ControlAnswer(ok=False, error=why, error_code=FORBIDDEN), []
        else:
            try:
                answer, out = self._control(kind, msg, principal)
            except Exception as exc:  # noqa: BLE001 - the caller is answered, not left to its timeout
                log.exception("a %s control request failed; the service keeps serving", kind.name)
                self.engine.counters["handler_errors"] += 1
                self.metrics.internal_error("shell")
                answer, out = messages.ControlAnswer(ok=False, error=f"internal error: {type(exc).__name__}: {exc}",
                                                     error_code=INTERNAL_ERROR), []
        reply = protocol.ControlReply(ok=answer.ok, changed=answer.changed, state=answer.state,
                                      detail=dict(answer.detail), error=answer.error, error_code=answer.error_code)
        frames = protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY, reply)
        size = sum(len(f) for f in frames[1:])
        if size > protocol.MAX_MESSAGE_BYTES:  # the client's socket would drop it and its connection (as in
            # _send); STATS names every worker, and a worker's id or device is as long as the worker says
            log.warning("the %s reply is %d bytes, over the message limit; answered reply_too_large", kind.name, size)
            reply = protocol.ControlReply(ok=False, changed=answer.changed, state=answer.state,
                                          error=f"the reply is {size} bytes, over the "
                                                f"{protocol.MAX_MESSAGE_BYTES}-byte message limit",
                                          error_code="reply_too_large")
            frames = protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY, reply)
        self.control_sock.send_multipart(frames)
        self._send_all(out)
        if kind is protocol.Kind.SHUTDOWN and answer.ok:
            self.stop_now.set()

    def _scope(self, sender: Principal) -> str | None:
        """Whose request ids a message from `sender` names: its own, under keys (core/request_scope.py)."""
        return sender.name if self.secure else None

    def _control(self, kind: protocol.Kind, msg, principal: Principal) -> tuple[messages.ControlAnswer, list]:
        engine = self.engine
        if kind in (protocol.Kind.CANCEL, protocol.Kind.STATUS):
            scope = self._scope(principal)
            if scope is not None and msg.principal is not None:
                # a name, never a path: "robot-a/sub" would read as part of an id ("sub/<id>" of robot-a's)
                try:
                    scope = check_name("principal", msg.principal)
                except ValueError as exc:
                    return messages.ControlAnswer(ok=False, error=str(exc), error_code="invalid_value"), []
            # another's namespace is named, and core/access.py's rule decides who may act there
            rid = scoped_id(scope, msg.request_id)
            if kind is protocol.Kind.CANCEL:
                return engine.cancel(rid, time.monotonic(), principal)
            return engine.status(rid, principal), []
        if kind is protocol.Kind.STATS:
            security = {"curve": self.secure, "insecure": bool(self.insecure_sockets),
                        "insecure_sockets": list(self.insecure_sockets), "unkeyed_local": list(self.unkeyed_local),
                        "asked_by": principal.name}
            return messages.ControlAnswer(ok=True, detail={**engine.stats(), "security": security}), []
        if kind is protocol.Kind.DRAIN:
            return engine.drain(), []
        if kind is protocol.Kind.WORKER_LEAVE:
            return engine.worker_leave(msg.worker_id, time.monotonic())
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


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _read(frames: list[bytes], allowed) -> tuple[bytes, bool, protocol.Kind, Any]:
    """split_envelope + decode: every unreadable message is a ProtocolError."""
    identity, delimited, kind, payload = protocol.split_envelope(frames, allowed)
    return identity, delimited, kind, protocol.decode(kind, payload)
