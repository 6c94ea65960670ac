"""The blocking Python client for the native protocol, `Client` (service/async_client.py: the asyncio one).

Both speak over a DEALER socket, so many groups can be in flight on one connection; replies are
matched to requests by request_id. What they send is in service/requests.py, what they are told in
service/replies.py (both importable from here, as before the split).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, NamedTuple

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.endpoints import ipv6_for
from candidate_scheduler.service.keys import ClientKeys
from candidate_scheduler.service.next_run import NOT_RUN_BY_A_STOPPING_SCHEDULER, NextRun
from candidate_scheduler.service.replies import (  # noqa: F401 - the names callers import from here
    ClientClosed,
    ConnectionDropped,
    Forbidden,
    Result,
    SchedulerUnavailable,
    ServiceError,
)
from candidate_scheduler.service.requests import make_request, submit_frames, synthetic_image  # noqa: F401


def _reply(frames: list[bytes], allowed) -> Any:
    """The reply `frames` hold; an ERROR reply raises ServiceError."""
    kind, msg = protocol.decode_frames(frames, allowed)
    if kind is protocol.Kind.ERROR:
        raise ServiceError(msg)
    return msg


def unreadable_id(frames: list[bytes]) -> str | None:
    """The request id a reply the client cannot read names, if it can read one."""
    return protocol.request_id_of(frames[1]) if len(frames) == 2 else None


def unreadable(exc: protocol.ProtocolError, frames: list[bytes]) -> protocol.ProtocolError:
    return protocol.ProtocolError(exc.kind, f"the reply to {unreadable_id(frames)!r} could not be read: {exc}")


def restarted(sent_to: str | None, now: str | None) -> bool:
    """Whether the scheduler that answers now is another run than the one a group was sent to (either
    unknown, or a server that does not say: no verdict)."""
    return bool(sent_to) and bool(now) and sent_to != now


DEFAULT_LIVENESS_S = 3.0  # silence before a PING, and how long the PING may take: a bound of 6 s
SEND_TIMEOUT_MS = 10_000
# groups a Client awaits (sent, not yet waited for to the end): only their replies are kept, so a reply
# nobody waits for -- a second one after a resend, or one come after its wait gave up -- is not held forever
_SENT_TO_KEPT = 100_000
# the replies that came after their wait gave up (TimeoutError), kept for a wait that may come again: past
# this many bytes the oldest go (candidates' arrays are up to 64 MiB a reply, and a loop that waits a
# little and moves on makes one a group); a wait for one of those raises TimeoutError at once
_LATE_KEPT_BYTES = 256 << 20


class Sent(NamedTuple):
    """An awaited group: the scheduler run it was sent to, and the connection drops seen before it was."""

    incarnation: str | None
    drops: int


def client_socket(ctx: zmq.Context, endpoint: str, keys: ClientKeys | None) -> zmq.Socket:
    sock = ipv6_for(ctx.socket(zmq.DEALER), endpoint)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
    if keys is not None:
        keys.apply(sock)
    sock.connect(endpoint)
    return sock


class Client:
    """Blocking client. One instance per thread. `keys`: this client's CURVE keys when the scheduler
    requires them (`ClientKeys.load(key_dir, name)`; service/keys.py)."""

    def __init__(self, endpoint: str, control_endpoint: str | None = None, timeout_s: float = 600.0,
                 keys: ClientKeys | None = None, liveness_s: float | None = DEFAULT_LIVENESS_S):
        self.ctx = zmq.Context.instance()
        self.keys = keys
        self.liveness_s = liveness_s  # None: wait out the timeout whatever happens
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint
        self.timeout_s = timeout_s
        self._sock = self._dealer(endpoint)
        # a dropped connection loses the replies routed to it (the scheduler answers the connection a group
        # came on): the monitor counts drops, and a group sent before one is sent again (ConnectionDropped)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._drops = 0
        self._verdict: tuple[int, bool] = (0, True)  # (drops, whether the same run answered after them)
        # replies that came for a group nobody awaited (a second answer to one submission, one that came
        # after its wait gave up): dropped, and counted here
        self.unclaimed = 0
        self._ctl = None
        # replies of awaited groups (a ProtocolError: one that could not be read)
        self._pending: dict[str, protocol.GroupResult | protocol.ErrorReply | protocol.ProtocolError] = {}
        self._pongs: set[int] = set()
        self._nonce = itertools.count(1)
        self._incarnation: str | None = None  # of the scheduler's last PONG (None: none yet)
        self._sent_to: dict[str, Sent] = {}  # awaited request id -> where and when it was sent
        self._gave_up: dict[str, None] = {}  # awaited groups whose last wait gave up (TimeoutError)
        self._late: dict[str, int] = {}  # their replies kept, oldest first -> its bytes (_LATE_KEPT_BYTES)
        self._late_bytes = 0
        self._late_dropped: dict[str, None] = {}  # ids whose late reply went for the budget (until sent again)
        self._closed = False

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = client_socket(self.ctx, endpoint, self.keys)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)  # a blocking client must not block forever
        return sock

    def send(self, request: protocol.SubmitRequest, timeout_s: float | None = None) -> str:
        """Send one group; `timeout_s` bounds the PING of a client's first send (`submit` passes what is left
        of its own timeout, which that PING, `liveness_s` long, would otherwise overrun), and the wait for
        room in a full send queue (TimeoutError; SchedulerUnavailable past SEND_TIMEOUT_MS)."""
        self._check_open()
        frames = submit_frames(request)  # one the scheduler could not take fails first, not after a PING
        if self.liveness_s is not None and self._incarnation is None:
            # once: which run of the scheduler this client talks to ("" when it did not answer: no verdict)
            probe_s = self.liveness_s if timeout_s is None else min(self.liveness_s, timeout_s)
            if probe_s > 0 and not self._answers_ping(probe_s) and probe_s >= self.liveness_s:
                self._incarnation = ""  # cut short by the timeout instead: no verdict, the next send asks again
        self._count_drops()  # one before this send is not this group's
        # a send waits for room in the queue (a full one: the scheduler away), within the caller's timeout
        send_ms = SEND_TIMEOUT_MS if timeout_s is None else max(0, min(SEND_TIMEOUT_MS, int(timeout_s * 1000)))
        self._sock.setsockopt(zmq.SNDTIMEO, send_ms)
        try:
            self._sock.send_multipart(frames)
        except zmq.Again:  # SNDTIMEO: no scheduler to queue for (a refused handshake), or a full queue
            if send_ms < SEND_TIMEOUT_MS:  # cut short by the caller's timeout: not a verdict on the scheduler
                raise TimeoutError(f"could not send {request.request_id!r} to {self.endpoint} within its timeout: "
                                   "no room to queue it for the scheduler") from None
            raise SchedulerUnavailable(f"could not send {request.request_id!r} to {self.endpoint} within "
                                       f"{SEND_TIMEOUT_MS / 1000:.0f} s") from None
        self._sent_to.pop(request.request_id, None)  # sent again: the newest, last to be forgotten
        self._late_dropped.pop(request.request_id, None)
        self._sent_to[request.request_id] = Sent(self._incarnation, self._drops)
        if len(self._sent_to) > _SENT_TO_KEPT:  # sent and never waited for: forget the oldest (its wait, if
            self.forget(next(iter(self._sent_to)))  # it ever comes, times out)
        return request.request_id

    def forget(self, request_id: str) -> None:
        """Stop awaiting a group: its reply, kept or still to come, is dropped."""
        self._sent_to.pop(request_id, None)
        self._pending.pop(request_id, None)
        self._gave_up.pop(request_id, None)
        self._late_bytes -= self._late.pop(request_id, 0)
        self._late_dropped.pop(request_id, None)

    def _keep_late(self, request_id: str, size: int) -> None:
        """A reply come after its wait gave up is kept, within _LATE_KEPT_BYTES: past them the oldest go."""
        self._late_bytes += size - self._late.pop(request_id, 0)  # a second answer replaces the first
        self._late[request_id] = size
        while self._late_bytes > _LATE_KEPT_BYTES:
            oldest = next(iter(self._late))
            self.forget(oldest)
            self._late_dropped[oldest] = None  # its wait says so, rather than wait out its timeout
            if len(self._late_dropped) > _SENT_TO_KEPT:
                del self._late_dropped[next(iter(self._late_dropped))]

    def wait(self, request_id: str, timeout_s: float | None = None) -> Result:
        """The group's reply. TimeoutError after `timeout_s`; SchedulerUnavailable as soon as the
        scheduler stops answering PINGs (see `liveness_s`); ConnectionDropped when the connection dropped
        since the group was sent and its reply may be lost: send it again. A reply that comes after a
        wait gave up is kept for the next (`wait(rid, 0)` looks again), within _LATE_KEPT_BYTES of such
        replies: past them the oldest go, and a wait for one raises TimeoutError at once."""
        self._check_open()
        if request_id in self._late_dropped:
            raise TimeoutError(f"no reply for {request_id!r}: it came after a wait for it gave up and was dropped, "
                               f"the oldest of the late replies kept past {_LATE_KEPT_BYTES} bytes; send it again "
                               "under its id (the scheduler answers it from the replies it keeps)")
        self._gave_up.pop(request_id, None)
        try:
            self._await_reply(request_id, time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s))
        except (TimeoutError, SchedulerUnavailable):  # ConnectionDropped among them
            if request_id in self._sent_to:  # still awaited: a reply that comes meanwhile is late (its bytes capped)
                self._gave_up[request_id] = None
            raise
        self._sent_to.pop(request_id, None)
        self._late_bytes -= self._late.pop(request_id, 0)
        reply = self._pending.pop(request_id)
        if isinstance(reply, protocol.ErrorReply):
            raise ServiceError(reply)
        if isinstance(reply, protocol.ProtocolError):
            raise reply
        return Result.from_wire(reply)

    def _await_reply(self, request_id: str, deadline: float) -> None:
        """Until the group's reply is in `_pending`; `wait`'s errors."""
        heard = time.monotonic()
        sent = self._sent_to.get(request_id)
        if self.liveness_s is not None and sent is not None and sent.incarnation == "":
            # sent after a first PING that nobody answered: that silence counts, so a scheduler that is not
            # there is said after one more PING (2 x liveness_s in all, as AsyncClient), not a silence and a PING
            heard -= self.liveness_s
        while request_id not in self._pending:
            if self._dropped_since_sent(request_id):
                while self._read_one(time.monotonic() + 0.001):  # what came before the drop, first
                    pass
                if request_id not in self._pending:
                    self._after_drop(request_id, deadline)
                continue
            quiet_until = deadline if self.liveness_s is None else min(deadline, heard + self.liveness_s)
            if self._read_one(quiet_until):
                heard = time.monotonic()
                continue
            if self._dropped_since_sent(request_id) or time.monotonic() < quiet_until:
                continue  # woken by a drop, or the poll's whole milliseconds ended short
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no reply for {request_id!r}")
            probe_s = min(self.liveness_s, deadline - time.monotonic())
            if not self._answers_ping(probe_s):
                if probe_s < self.liveness_s:  # cut short by the timeout: not a verdict on the scheduler
                    raise TimeoutError(f"no reply for {request_id!r}")
                self._incarnation = None  # the next send learns which run answers then
                raise SchedulerUnavailable(f"the scheduler at {self.endpoint} did not answer a PING within "
                                           f"{self.liveness_s:.1f} s (after {self.liveness_s:.1f} s without a word); "
                                           f"{request_id!r} was not answered")
            sent = self._sent_to.get(request_id)
            if sent is not None and restarted(sent.incarnation, self._incarnation):
                self._restart_verdict(request_id, deadline)
            heard = time.monotonic()

    def _dropped_since_sent(self, request_id: str) -> bool:
        sent = self._sent_to.get(request_id)
        return sent is not None and self._drops > sent.drops

    def _after_drop(self, request_id: str, deadline: float) -> None:
        """The connection dropped since `request_id` was sent. If the run it was sent to still answers, the
        group (or its kept reply) is there: ConnectionDropped, to send it again. Another run, or none: the
        restart and liveness verdicts decide, as without a drop."""
        sent = self._sent_to[request_id]
        if self.liveness_s is not None and self._verdict[0] != self._drops:  # one PING a drop, for every group
            drops, probe_s = self._drops, min(self.liveness_s, deadline - time.monotonic())
            answered = probe_s > 0 and self._answers_ping(probe_s)
            if not answered and probe_s < self.liveness_s:  # cut short by the timeout: not a verdict
                raise TimeoutError(f"no reply for {request_id!r}")
            self._verdict = (drops, answered)
        if self.liveness_s is not None and (not self._verdict[1] or restarted(sent.incarnation, self._incarnation)):
            self._sent_to[request_id] = sent._replace(drops=self._drops)
            if self._verdict[1]:  # another run answers: decided now, as the replies of groups sent to it since
                self._restart_verdict(request_id, deadline)  # would put off the silence that decides it
            return
        raise ConnectionDropped(f"the connection to {self.endpoint} dropped after {request_id!r} was sent; its "
                                "reply may be lost: send it again under its id")

    def _restart_verdict(self, request_id: str, deadline: float) -> None:
        """Another run answers than the one `request_id` was sent to: waited on if that run holds it, else
        SchedulerUnavailable."""
        if not self._held_here(request_id, deadline - time.monotonic()):
            self._sent_to.pop(request_id, None)
            raise SchedulerUnavailable(f"the scheduler at {self.endpoint} restarted; {request_id!r} was sent to "
                                       "the run before and was not answered")

    def _held_here(self, request_id: str, timeout_s: float) -> bool:
        """Whether the scheduler that answers now has the group after all: sent after a restart this
        client had not heard of yet, it reached the new run (asked on the control socket, when there is one)."""
        if self.control_endpoint is None:
            return False
        if timeout_s <= 0:
            return False
        deadline = time.monotonic() + timeout_s
        # The control socket does not wait for the request socket: asked at once, the new run may not have
        # read yet a SUBMIT ZMQ held while the connection came back, and says "unknown" of a group it is
        # about to run. A PING on the request socket comes back behind it (unanswered in half the time, a
        # burst ahead of it, the STATUS is asked all the same).
        self.ping(min(timeout_s, self.liveness_s or timeout_s) / 2)
        try:
            reply = self.control(protocol.Kind.STATUS, protocol.StatusRequest(request_id),
                                 max(deadline - time.monotonic(), 0.001))
            held = reply.ok and reply.state not in (None, "unknown")
        except (TimeoutError, ServiceError):
            return False
        if held:
            self._sent_to[request_id] = Sent(self._incarnation, self._drops)
        return held

    def _answers_ping(self, timeout_s: float) -> bool:
        """A liveness probe: PING on the control socket when there is one (a burst of submissions on
        the request socket would queue a PING behind them), else on the request socket."""
        if self.control_endpoint is None:
            return self.ping(timeout_s)
        nonce = next(self._nonce)
        ctl = self._control_socket()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ctl.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(nonce)), flags=zmq.NOBLOCK)
                break
            except zmq.Again:  # no peer to queue for (it is down, or a refused handshake tore the pipe down)
                if time.monotonic() >= deadline:  # not answered
                    return False
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))  # a restarted one is found at once
        try:
            while (remaining := deadline - time.monotonic()) > 0 and ctl.poll(int(remaining * 1000)):
                kinds = {protocol.Kind.PONG, protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR}
                kind, msg = protocol.decode_frames(ctl.recv_multipart(), kinds)
                if kind is protocol.Kind.PONG and msg.nonce == nonce:
                    self._incarnation = msg.incarnation
                    return True
        except BaseException:  # interrupted (Ctrl-C, a signal), or unreadable: its PONG may still come
            self._drop_control()
            raise
        # unanswered: drop the socket, so a late PONG never reads as the answer to a later request
        self._drop_control()
        return False

    def submit(self, image: np.ndarray, prompt: str | list[str] = "", timeout_s: float | None = None,
               resubmit: bool = False, **kwargs: Any) -> Result:
        """Send one group and wait for its reply. With `resubmit`, the same request (same id, same seeds)
        is sent again, and runs again with the same bits, when the scheduler did not run it:
        - it stopped answering: sent again once it answers a PING (a restarted scheduler runs it; one that
          was only slow answers it once);
        - it was stopping, and answered `shutting_down` or refused it `stopping`: sent again once another
          run of the scheduler answers a PING (its incarnation); until the timeout (TimeoutError)."""
        self._check_open()
        request = make_request(image, prompt, **kwargs)
        rid = request.request_id
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        if resubmit and not self._incarnation:
            self._answers_ping(min(self.liveness_s or 1.0, max(0.0, deadline - time.monotonic())))
        resent: list[str] = []
        try:
            while True:
                try:
                    self.send(request, max(0.0, deadline - time.monotonic()))
                    sent_to = self._sent_to[rid].incarnation
                    result = self.wait(rid, max(0.0, deadline - time.monotonic()))
                    if not resubmit or (result.status, result.error_code) not in NOT_RUN_BY_A_STOPPING_SCHEDULER:
                        result.resent = resent
                        return result
                    resent.append(result.error_code)
                    self._await_another_run(NextRun(sent_to, self.liveness_s), deadline,
                                            f"{rid!r} was answered {result.status} ({result.error_code}) by a "
                                            "stopping scheduler")
                except ConnectionDropped:  # the same run holds it: sent again over the new connection
                    resent.append("reconnected")
                except SchedulerUnavailable:  # it stopped answering, or the send found no scheduler
                    if not resubmit:
                        raise
                    resent.append("unavailable")
                    self._await_another_run(NextRun(None, self.liveness_s, gone=True), deadline,
                                            f"no reply for {rid!r}: the scheduler stopped answering")
        finally:  # answered or given up: a later reply (the stopping run's to the resend, say) has no taker
            self.forget(rid)

    def _await_another_run(self, nxt: NextRun, deadline: float, what: str) -> None:
        """Until the run that answers a PING is the one `nxt` waits for; TimeoutError at `deadline`. A
        stopping run answers PINGs while it serves what it admitted: asked again every 0.2 s, and a probe
        that fails at once (no peer) waits out its time, so nothing spins."""
        while (remaining := deadline - time.monotonic()) > 0:
            started, probe_s = time.monotonic(), min(nxt.probe_s, remaining)
            if self._answers_ping(probe_s):
                if nxt.answered_by(self._incarnation):
                    # what came meanwhile on the request socket (a stopping run's second answer to the group)
                    # is read now, while the group is not awaited: after the resend it would read as its answer
                    while self._read_one(time.monotonic()):
                        pass
                    return
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            else:
                nxt.unanswered()
                time.sleep(max(0.0, started + probe_s - time.monotonic()))
        raise TimeoutError(f"{what}, and it did not come back before the timeout")

    def ping(self, timeout_s: float = 2.0) -> bool:
        """Whether the scheduler answers a PING within `timeout_s`; results of groups in flight that arrive
        first are kept."""
        self._check_open()
        nonce = next(self._nonce)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(nonce)), flags=zmq.NOBLOCK)
                break
            except zmq.Again:  # no connection now (reconnecting after a drop, or nobody there): tried again
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        while nonce not in self._pongs:
            if not self._read_one(deadline) and time.monotonic() >= deadline:
                return False
        self._pongs = {n for n in self._pongs if n > nonce}  # with any late answer to an earlier ping
        return True

    def _read_one(self, deadline: float) -> bool:
        """Read one reply into `_pending` (a RESULT) or `_pongs`; False when none came by `deadline`, or
        when the connection dropped first (counted in `_drops`)."""
        # past `deadline` still a look (poll 0): `wait(rid, 0)` takes a reply that has come
        ready = dict(self._poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))
        if self._monitor in ready:
            self._count_drops()
        if self._sock not in ready:
            return False
        frames = self._sock.recv_multipart()
        try:
            kind, msg = protocol.decode_frames(frames, {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})
        except protocol.ProtocolError as exc:  # one that names a group fails that group's wait, not the reader's
            rid = unreadable_id(frames)
            if rid is None:
                raise
            if rid in self._sent_to:
                self._pending[rid] = unreadable(exc, frames)
                if rid in self._gave_up:
                    self._keep_late(rid, 0)  # the error only is kept
            else:
                self.unclaimed += 1
            return True
        if kind is protocol.Kind.PONG:
            self._pongs.add(msg.nonce)
            self._incarnation = msg.incarnation
        elif msg.request_id in self._sent_to:  # awaited: its wait takes it (an ERROR raises there)
            self._pending[msg.request_id] = msg
            if msg.request_id in self._gave_up:
                self._keep_late(msg.request_id, sum(len(f) for f in frames))
        elif kind is protocol.Kind.ERROR and msg.request_id is None:  # no group to blame: whoever reads it
            raise ServiceError(msg)
        else:
            self.unclaimed += 1
        return True

    def _count_drops(self) -> None:
        while self._monitor.poll(0):
            self._monitor.recv_multipart()
            self._drops += 1

    # ---- control ------------------------------------------------------------------------------------
    def control(self, kind: protocol.Kind, payload, timeout_s: float = 10.0) -> protocol.ControlReply:
        if self.control_endpoint is None:
            raise ValueError("this client has no control endpoint")
        self._check_open()
        ctl = self._control_socket()
        try:
            ctl.send_multipart(protocol.encode(kind, payload))
        except zmq.Again:
            raise TimeoutError(f"could not send {kind.name}: no scheduler to send it to") from None
        try:
            if not ctl.poll(int(timeout_s * 1000)):
                raise TimeoutError(f"no control reply to {kind.name}")
            frames = ctl.recv_multipart()
        except BaseException:
            # timed out, or interrupted (Ctrl-C, a signal) with its reply still to come: that reply must not
            # read as the answer to the next request, so the socket goes
            self._drop_control()
            raise
        return _reply(frames, {protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR})

    def _control_socket(self) -> zmq.Socket:
        if self._ctl is None:
            self._ctl = self._dealer(self.control_endpoint)
        return self._ctl

    def _drop_control(self) -> None:
        if self._ctl is not None:
            self._ctl.close(0)
            self._ctl = None

    def cancel(self, request_id: str, principal: str | None = None) -> protocol.ControlReply:
        """`principal`: whose request id it is, when not this client's own (an admin's reach; with keys, each
        principal's ids are its own: core/request_scope.py)."""
        return self.control(protocol.Kind.CANCEL, protocol.CancelRequest(request_id, principal))

    def status(self, request_id: str, principal: str | None = None) -> protocol.ControlReply:
        """`principal`: as `cancel`'s."""
        return self.control(protocol.Kind.STATUS, protocol.StatusRequest(request_id, principal))

    def stats(self) -> dict:
        reply = self.control(protocol.Kind.STATS, protocol.Empty())
        if not reply.ok:
            raise Forbidden(reply.error) if reply.error_code == "forbidden" else RuntimeError(reply.error)
        return dict(reply.detail)

    def drain(self) -> protocol.ControlReply:
        return self.control(protocol.Kind.DRAIN, protocol.Empty())

    def shutdown(self) -> protocol.ControlReply:
        return self.control(protocol.Kind.SHUTDOWN, protocol.Empty())

    def worker_leave(self, worker_id: str) -> protocol.ControlReply:
        """Ask one worker to leave: no new work; it finishes what it holds, then goes (admin)."""
        return self.control(protocol.Kind.WORKER_LEAVE, protocol.WorkerLeaveRequest(worker_id))

    def _check_open(self) -> None:
        if self._closed:  # its sockets are gone: a ZMQError about a non-socket would say less
            raise ClientClosed(f"the client of {self.endpoint} is closed")

    def close(self) -> None:
        if self._closed:  # closed again (inside a `with` block, say): the sockets are gone already
            return
        self._closed = True
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(0)
        if self._ctl is not None:
            self._ctl.close(0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
