"""Python clients for the native protocol: `Client` (blocking) and `AsyncClient` (asyncio).

Both speak over a DEALER socket, so many groups can be in flight on one connection; replies are
matched to requests by request_id.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.control_link import ControlLink
from candidate_scheduler.service.keys import ClientKeys
from candidate_scheduler.service.next_run import NOT_RUN_BY_A_STOPPING_SCHEDULER, NextRun


@dataclass
class Result:
    """A group's reply with arrays decoded."""

    request_id: str
    status: str
    action: np.ndarray | None = None
    candidates: np.ndarray | None = None
    candidate_seeds: list[int] = field(default_factory=list)
    chosen_candidate: int | None = None
    error: str | None = None
    error_code: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    served_count: int | None = None  # candidates served (fewer than requested under an elastic count)
    # rollouts: log_probs, latents, next_latents, means, stds, final_latents (candidate axis first),
    # sigmas [T+1], timesteps [T], step_indices [S] (see protocol.RolloutResult)
    rollout: dict[str, np.ndarray] | None = None
    # set by a resubmitting client: why it sent the group again, in order (`shutting_down` or `stopping`: a
    # stopping scheduler did not run it; `unavailable`: it stopped answering); empty when sent once
    resent: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @classmethod
    def from_wire(cls, r: protocol.GroupResult) -> Result:
        return cls(
            request_id=r.request_id,
            status=r.status,
            action=None if r.action is None else protocol.array_from_wire(r.action),
            candidates=None if r.candidates is None else protocol.array_from_wire(r.candidates),
            candidate_seeds=list(r.candidate_seeds),
            chosen_candidate=r.chosen_candidate,
            error=r.error,
            error_code=r.error_code,
            metrics=dict(r.metrics),
            served_count=r.served_count,
            rollout=None if r.rollout is None else _decode_rollout(r.rollout),
        )

    def to_json(self) -> dict:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "action": None if self.action is None else self.action.tolist(),
            "candidates": None if self.candidates is None else self.candidates.tolist(),
            "candidate_seeds": self.candidate_seeds,
            "served_count": self.served_count,
            "chosen_candidate": self.chosen_candidate,
            "error": self.error,
            "error_code": self.error_code,
            "metrics": self.metrics,
            "rollout": None if self.rollout is None else {k: v.tolist() for k, v in self.rollout.items()},
        }


def _decode_rollout(r: protocol.RolloutResult) -> dict[str, np.ndarray]:
    out = {name: protocol.array_from_wire(getattr(r, name)) for name in r.__struct_fields__ if name != "step_indices"}
    out["step_indices"] = np.asarray(r.step_indices, dtype=np.int64)
    return out


class ServiceError(RuntimeError):
    """The scheduler could not read a message at all (ErrorReply)."""

    def __init__(self, reply: protocol.ErrorReply):
        super().__init__(f"{reply.error_code}: {reply.error}")
        self.reply = reply


def _reply(sock: zmq.Socket, allowed) -> Any:
    """The reply waiting on `sock`; an ERROR reply raises ServiceError."""
    kind, msg = protocol.decode_frames(sock.recv_multipart(), allowed)
    if kind is protocol.Kind.ERROR:
        raise ServiceError(msg)
    return msg


def make_request(
    image: np.ndarray,
    prompt: str | list[str] = "",
    *,
    request_id: str | None = None,
    count: int = 1,
    reducer: str = "mean",
    return_candidates: bool = False,
    seed: int = 42,
    seed_policy: str = "per_candidate",
    seeds: list[int] | None = None,
    min_count: int | None = None,
    deadline_s: float | None = None,
    initial_noise: np.ndarray | None = None,
    on_behalf: str | None = None,
    **sampling: Any,
) -> protocol.SubmitRequest:
    """Build a SUBMIT payload. `image`: uint8 [H, W, 3], or [B, H, W, 3] for B observations (one
    reduced action each). Sampling keywords: height, width, steps, horizon, guidance_scale,
    action_mode, domain_id, raw_action_dim, fps, negative_prompt, and for RL rollouts rollout,
    noise_level, return_step_indices. `min_count` makes the count elastic under `deadline_s` (the first n
    candidates, n in [min_count, count]). `initial_noise`: float [count, horizon, D] caller-provided x_T."""
    image = np.asarray(image)
    return protocol.SubmitRequest(
        request_id=request_id or uuid.uuid4().hex,
        images=protocol.array_to_wire(image),
        prompt=prompt,
        candidates=protocol.CandidateSpecMsg(count, reducer, return_candidates, seed_policy, seeds, min_count),
        seed=seed,
        sampling=protocol.SamplingMsg(**sampling),
        batched=image.ndim == 4,
        deadline_s=deadline_s,
        initial_noise=None if initial_noise is None else protocol.array_to_wire(np.asarray(initial_noise, dtype=np.float32)),
        on_behalf=on_behalf,
    )


def synthetic_image(height: int = 64, width: int = 64, seed: int = 0) -> np.ndarray:
    """A deterministic test observation (no files, no downloads)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


class Forbidden(PermissionError):
    """The scheduler refused a control request: not this key's right (core/access.py)."""


class SchedulerUnavailable(ConnectionError):
    """The scheduler stopped answering: after `liveness_s` without a word from it, a PING went
    unanswered for `liveness_s` more -- or was answered by another run of it (a restart on the same
    address, faster than the PING: protocol.Pong.incarnation), which never heard of the group. A client
    learns of a dead scheduler within 2 x liveness_s instead of its whole timeout; resubmitting the same
    request id then is safe (core/resubmission.py)."""


def _restarted(sent_to: str | None, now: str | None) -> bool:
    """Whether the scheduler that answers now is another run than the one a group was sent to (either
    unknown, or a server that does not say: no verdict)."""
    return bool(sent_to) and bool(now) and sent_to != now


DEFAULT_LIVENESS_S = 3.0  # silence before a PING, and how long the PING may take: a bound of 6 s
SEND_TIMEOUT_MS = 10_000
_SENT_TO_KEPT = 100_000  # groups whose incarnation a Client remembers until they are waited for


def _dealer(ctx: zmq.Context, endpoint: str, keys: ClientKeys | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
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
        self._ctl = None
        self._pending: dict[str, protocol.GroupResult] = {}
        self._pongs: set[int] = set()
        self._nonce = itertools.count(1)
        self._incarnation: str | None = None  # of the scheduler's last PONG (None: none yet)
        self._sent_to: dict[str, str | None] = {}  # request id -> the incarnation it was sent to

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = _dealer(self.ctx, endpoint, self.keys)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)  # a blocking client must not block forever
        return sock

    def send(self, request: protocol.SubmitRequest) -> str:
        if self.liveness_s is not None and self._incarnation is None:
            # once: which run of the scheduler this client talks to ("" when it did not answer: no verdict)
            self._incarnation = self._incarnation if self._answers_ping(self.liveness_s) else ""
        try:
            self._sock.send_multipart(protocol.encode(protocol.Kind.SUBMIT, request))
        except zmq.Again:  # SNDTIMEO: no scheduler to queue for (a refused handshake), or a full queue
            raise SchedulerUnavailable(f"could not send {request.request_id!r} to {self.endpoint} within "
                                       f"{SEND_TIMEOUT_MS / 1000:.0f} s") from None
        self._sent_to.pop(request.request_id, None)  # sent again: the newest, last to be forgotten
        self._sent_to[request.request_id] = self._incarnation
        if len(self._sent_to) > _SENT_TO_KEPT:  # sent and never waited for: forget the oldest (its wait, if
            del self._sent_to[next(iter(self._sent_to))]  # it ever comes, gives no restart verdict: a timeout)
        return request.request_id

    def wait(self, request_id: str, timeout_s: float | None = None) -> Result:
        """The group's reply. TimeoutError after `timeout_s`; SchedulerUnavailable as soon as the
        scheduler stops answering PINGs (see `liveness_s`)."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        heard = time.monotonic()
        while request_id not in self._pending:
            quiet_until = deadline if self.liveness_s is None else min(deadline, heard + self.liveness_s)
            if self._read_one(quiet_until):
                heard = time.monotonic()
                continue
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
            if _restarted(self._sent_to.get(request_id), self._incarnation) and not self._held_here(request_id):
                self._sent_to.pop(request_id, None)
                raise SchedulerUnavailable(f"the scheduler at {self.endpoint} restarted; {request_id!r} was sent to "
                                           "the run before and was not answered")
            heard = time.monotonic()
        self._sent_to.pop(request_id, None)
        return Result.from_wire(self._pending.pop(request_id))

    def _held_here(self, request_id: str) -> bool:
        """Whether the scheduler that answers now has the group after all: sent after a restart this
        client had not heard of yet, it reached the new run (asked on the control socket, when there is one)."""
        if self.control_endpoint is None:
            return False
        try:
            reply = self.status(request_id)
            held = reply.ok and reply.state not in (None, "unknown")
        except (TimeoutError, ServiceError):
            return False
        if held:
            self._sent_to[request_id] = self._incarnation
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
        while (remaining := deadline - time.monotonic()) > 0 and ctl.poll(int(remaining * 1000)):
            kind, msg = protocol.decode_frames(ctl.recv_multipart(),
                                               {protocol.Kind.PONG, protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR})
            if kind is protocol.Kind.PONG and msg.nonce == nonce:
                self._incarnation = msg.incarnation
                return True
        # unanswered: drop the socket, so a late PONG never reads as the answer to a later request
        ctl.close(0)
        self._ctl = None
        return False

    def submit(self, image: np.ndarray, prompt: str | list[str] = "", timeout_s: float | None = None,
               resubmit: bool = False, **kwargs: Any) -> Result:
        """Send one group and wait for its reply. With `resubmit`, the same request (same id, same seeds)
        is sent again, and runs again with the same bits, when the scheduler did not run it:
        - it stopped answering: sent again once it answers a PING (a restarted scheduler runs it; one that
          was only slow answers it once);
        - it was stopping, and answered `shutting_down` or refused it `stopping`: sent again once another
          run of the scheduler answers a PING (its incarnation); until the timeout (TimeoutError)."""
        request = make_request(image, prompt, **kwargs)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        if resubmit and not self._incarnation:
            self._answers_ping(min(self.liveness_s or 1.0, max(0.0, deadline - time.monotonic())))
        self.send(request)
        resent: list[str] = []
        while True:
            sent_to = self._sent_to.get(request.request_id)
            try:
                result = self.wait(request.request_id, max(0.0, deadline - time.monotonic()))
                if not resubmit or (result.status, result.error_code) not in NOT_RUN_BY_A_STOPPING_SCHEDULER:
                    result.resent = resent
                    return result
                resent.append(result.error_code)
                self._await_another_run(NextRun(sent_to, self.liveness_s), deadline, f"{request.request_id!r} was "
                                        f"answered {result.status} ({result.error_code}) by a stopping scheduler")
            except SchedulerUnavailable:
                if not resubmit:
                    raise
                resent.append("unavailable")
                self._await_another_run(NextRun(None, self.liveness_s, gone=True), deadline,
                                        f"no reply for {request.request_id!r}: the scheduler stopped answering")
            self.send(request)

    def _await_another_run(self, nxt: NextRun, deadline: float, what: str) -> None:
        """Until the run that answers a PING is the one `nxt` waits for; TimeoutError at `deadline`. A
        stopping run answers PINGs while it serves what it admitted: asked again every 0.2 s, and a probe
        that fails at once (no peer) waits out its time, so nothing spins."""
        while (remaining := deadline - time.monotonic()) > 0:
            started, probe_s = time.monotonic(), min(nxt.probe_s, remaining)
            if self._answers_ping(probe_s):
                if nxt.answered_by(self._incarnation):
                    return
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            else:
                nxt.unanswered()
                time.sleep(max(0.0, started + probe_s - time.monotonic()))
        raise TimeoutError(f"{what}, and it did not come back before the timeout")

    def ping(self, timeout_s: float = 2.0) -> bool:
        """Whether the scheduler answers a PING; results of groups in flight that arrive first are kept."""
        nonce = next(self._nonce)
        try:
            self._sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(nonce)), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        deadline = time.monotonic() + timeout_s
        while nonce not in self._pongs:
            if not self._read_one(deadline):
                return False
        self._pongs = {n for n in self._pongs if n > nonce}  # with any late answer to an earlier ping
        return True

    def _read_one(self, deadline: float) -> bool:
        """Read one reply into `_pending` (a RESULT) or `_pongs`; False when none came by `deadline`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._sock.poll(int(remaining * 1000)):
            return False
        kind, msg = protocol.decode_frames(self._sock.recv_multipart(),
                                           {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})
        if kind is protocol.Kind.ERROR:
            raise ServiceError(msg)
        if kind is protocol.Kind.PONG:
            self._pongs.add(msg.nonce)
            self._incarnation = msg.incarnation
        else:
            self._pending[msg.request_id] = msg
        return True

    # ---- control ------------------------------------------------------------------------------------
    def control(self, kind: protocol.Kind, payload, timeout_s: float = 10.0) -> protocol.ControlReply:
        if self.control_endpoint is None:
            raise ValueError("this client has no control endpoint")
        try:
            self._control_socket().send_multipart(protocol.encode(kind, payload))
        except zmq.Again:
            raise TimeoutError(f"could not send {kind.name}: no scheduler to send it to") from None
        if not self._ctl.poll(int(timeout_s * 1000)):
            self._ctl.close(0)  # a late reply must not read as the answer to the next request
            self._ctl = None
            raise TimeoutError(f"no control reply to {kind.name}")
        return _reply(self._ctl, {protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR})

    def _control_socket(self) -> zmq.Socket:
        if self._ctl is None:
            self._ctl = self._dealer(self.control_endpoint)
        return self._ctl

    def cancel(self, request_id: str) -> protocol.ControlReply:
        return self.control(protocol.Kind.CANCEL, protocol.CancelRequest(request_id))

    def status(self, request_id: str) -> protocol.ControlReply:
        return self.control(protocol.Kind.STATUS, protocol.StatusRequest(request_id))

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

    def close(self) -> None:
        self._sock.close(0)
        if self._ctl is not None:
            self._ctl.close(0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """asyncio client: `await client.submit(...)`; many groups in flight on one socket. With `control`
    (the scheduler's control endpoint), a group whose scheduler seems to have restarted is asked for
    (STATUS) before it is given up: sent after a restart this client had not heard of yet, it reached
    the new run, which answers it. Without it, such a group is reported `restarted` (as Client does
    without a control endpoint)."""

    def __init__(self, endpoint: str, keys: ClientKeys | None = None, liveness_s: float | None = DEFAULT_LIVENESS_S,
                 control: str | None = None):
        self.ctx = zmq.asyncio.Context.instance()
        self.endpoint = endpoint
        self._sock = _dealer(self.ctx, endpoint, keys)
        self.control = None if control is None else ControlLink(self.ctx, control, keys)
        self.liveness_s = liveness_s  # as Client's: SchedulerUnavailable within 2 x liveness_s (3 x: a restart)
        self._heard = time.monotonic()  # when anything last came from the scheduler
        self._probe: asyncio.Task | None = None  # one liveness PING at a time, shared by every waiter
        self._next_run_probe: asyncio.Task | None = None  # the same for waiters of a next run (shorter PINGs)
        self._futures: dict[str, asyncio.Future] = {}
        self._pongs: dict[int, asyncio.Future] = {}
        self._nonce = itertools.count(1)
        self._reader: asyncio.Task | None = None
        self._incarnation: str | None = None  # of the scheduler's last PONG (None: none yet)

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while self._futures or self._pongs:
            frames = await self._sock.recv_multipart()
            self._heard = time.monotonic()
            try:
                kind, msg = protocol.decode_frames(frames, {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})
            except protocol.ProtocolError:
                continue
            if kind is protocol.Kind.PONG:
                self._incarnation = msg.incarnation
                fut = self._pongs.pop(msg.nonce, None)
            elif kind is protocol.Kind.ERROR:
                # An unreadable message has no request id to match; fail the oldest waiter.
                fut = self._futures.pop(msg.request_id, None) if msg.request_id else None
                if fut is None and self._futures:
                    fut = self._futures.pop(next(iter(self._futures)))
                if fut is not None and not fut.done():
                    fut.set_exception(ServiceError(msg))
                continue
            else:
                fut = self._futures.pop(msg.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def submit_request(self, request: protocol.SubmitRequest, *, resubmit: bool = False) -> Result:
        """Send one group and wait for its reply. With `resubmit`, as `Client.submit`'s: the same request
        is sent again when the scheduler did not run it -- it stopped answering (SchedulerUnavailable), or
        it was stopping and answered `shutting_down` or `stopping` -- once another run of it answers a PING.
        No timeout of its own: bound it with `asyncio.wait_for` (cancelling it stops the wait)."""
        resent: list[str] = []
        while True:
            if resubmit and not self._incarnation:
                await self.ping(self.liveness_s or 1.0)  # which run this goes to: a stopping one is told apart
            sent_to = self._incarnation
            try:
                result = await self._submit_once(request)
            except SchedulerUnavailable:
                if not resubmit:
                    raise
                resent.append("unavailable")
                await self._await_another_run(NextRun(None, self.liveness_s, gone=True))
                continue
            if not resubmit or (result.status, result.error_code) not in NOT_RUN_BY_A_STOPPING_SCHEDULER:
                result.resent = resent
                return result
            resent.append(result.error_code)
            await self._await_another_run(NextRun(sent_to, self.liveness_s))

    async def _await_another_run(self, nxt: NextRun) -> None:
        """Until the run that answers a PING is the one `nxt` waits for; as `Client`'s. Every waiter shares
        one probe at a time: many robots behind a front waiting for the next run send it a few PINGs a
        second, not a few each."""
        while True:
            started, probe_s = time.monotonic(), nxt.probe_s
            if self._next_run_probe is None or self._next_run_probe.done():
                self._next_run_probe = asyncio.ensure_future(self.ping(probe_s))
            if await asyncio.shield(self._next_run_probe):
                if nxt.answered_by(self._incarnation):
                    return
                await asyncio.sleep(0.2)
            else:
                nxt.unanswered()
                await asyncio.sleep(max(0.0, started + probe_s - time.monotonic()))

    async def _submit_once(self, request: protocol.SubmitRequest) -> Result:
        if self.liveness_s is not None and self._incarnation is None:
            # once: which run of the scheduler this client talks to ("" when it did not answer: no verdict)
            self._incarnation = self._incarnation if await self.ping(self.liveness_s) else ""
        sent_to = self._incarnation
        fut = asyncio.get_running_loop().create_future()
        self._futures[request.request_id] = fut
        await self._sock.send_multipart(protocol.encode(protocol.Kind.SUBMIT, request))
        self._ensure_reader()
        if self.liveness_s is None:
            return Result.from_wire(await fut)
        while True:
            quiet = self._heard + self.liveness_s - time.monotonic()  # the scheduler spoke this recently
            try:
                return Result.from_wire(await asyncio.wait_for(asyncio.shield(fut), max(quiet, 0.01)))
            except TimeoutError:
                pass
            if time.monotonic() - self._heard < self.liveness_s:
                continue  # other groups' replies came meanwhile: it is alive
            if self._probe is None or self._probe.done():
                self._probe = asyncio.ensure_future(self.ping(self.liveness_s))
            if not await asyncio.shield(self._probe):
                self._futures.pop(request.request_id, None)
                self._incarnation = None  # the next send learns which run answers then
                raise SchedulerUnavailable(f"the scheduler at {self.endpoint} did not answer a PING within "
                                           f"{self.liveness_s:.1f} s; {request.request_id!r} was not answered")
            if _restarted(sent_to, self._incarnation) and not fut.done():
                if await self._held_here(request.request_id) or fut.done():  # answered meanwhile: taken above
                    sent_to = self._incarnation
                    continue
                self._futures.pop(request.request_id, None)
                raise SchedulerUnavailable(f"the scheduler at {self.endpoint} restarted; {request.request_id!r} was "
                                           "sent to the run before and was not answered")

    async def _held_here(self, request_id: str) -> bool:
        """Whether the run that answers now has the group (see the class docstring). Asked within
        `liveness_s`, the wait for the link included (every waiter of a restart asks), so a group is given
        up within 3 x liveness_s: the silence, the PING, the STATUS."""
        if self.control is None:
            return False
        ask = self.control.ask(protocol.Kind.STATUS, protocol.StatusRequest(request_id), self.liveness_s)
        try:
            reply = await asyncio.wait_for(ask, self.liveness_s)
        except (TimeoutError, zmq.ZMQError):  # no answer in time, or no link: no evidence it is held
            return False
        return reply is not None and reply.ok and reply.state not in (None, "unknown")

    async def submit(self, image: np.ndarray, prompt: str | list[str] = "", resubmit: bool = False,
                     **kwargs: Any) -> Result:
        return await self.submit_request(make_request(image, prompt, **kwargs), resubmit=resubmit)

    async def ping(self, timeout_s: float = 2.0) -> bool:
        """Whether the scheduler answers a PING within `timeout_s`, the send included (with no scheduler to
        send to it would wait for one)."""
        nonce = next(self._nonce)
        fut = asyncio.get_running_loop().create_future()
        self._pongs[nonce] = fut

        async def send_and_wait() -> None:
            await self._sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(nonce)))
            self._ensure_reader()
            await fut

        try:
            await asyncio.wait_for(send_and_wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:  # answered, timed out or cancelled: a PONG that comes later has nobody to wake
            self._pongs.pop(nonce, None)

    def close(self) -> None:
        for task in (self._reader, self._probe, self._next_run_probe):
            if task is not None:
                task.cancel()
        self._sock.close(0)
        if self.control is not None:
            self.control.close()
