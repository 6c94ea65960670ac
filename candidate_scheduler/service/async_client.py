"""The asyncio Python client for the native protocol, `AsyncClient` (service/client.py: the blocking one)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.client import (
    DEFAULT_LIVENESS_S,
    client_socket,
    restarted,
    unreadable,
    unreadable_id,
)
from candidate_scheduler.service.control_link import ControlLink, PingLink
from candidate_scheduler.service.keys import ClientKeys
from candidate_scheduler.service.next_run import NOT_RUN_BY_A_STOPPING_SCHEDULER, NextRun
from candidate_scheduler.service.replies import (
    ClientClosed,
    ConnectionDropped,
    Result,
    SchedulerUnavailable,
    ServiceError,
)
from candidate_scheduler.service.requests import make_request, submit_frames

log = logging.getLogger("candidate_scheduler.client")


def _retrieved(fut: asyncio.Future) -> None:
    """Mark `fut`'s exception seen: `close` fails every future it finds, the one of a call that was not
    awaiting it (still sending, say) too, and asyncio would log each as "never retrieved"."""
    if fut.done() and not fut.cancelled():
        fut.exception()


class AsyncClient:
    """asyncio client: `await client.submit(...)`; many groups in flight on one socket. With `control`
    (the scheduler's control endpoint), its liveness PINGs go there (as Client's), where no burst of
    submissions queues ahead of them, and a group whose scheduler seems to have restarted is asked for
    (STATUS) before it is given up: sent after a restart this client had not heard of yet, it reached
    the new run, which answers it. Without it, the PINGs go on the request socket and such a group is
    reported `restarted` (as Client does without a control endpoint)."""

    def __init__(self, endpoint: str, keys: ClientKeys | None = None, liveness_s: float | None = DEFAULT_LIVENESS_S,
                 control: str | None = None):
        self.ctx = zmq.asyncio.Context.instance()
        self.endpoint = endpoint
        self._sock = client_socket(self.ctx, endpoint, keys)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)  # as Client's: replies to a
        self._drops = 0  # dropped connection are lost, so a group sent before a drop is sent again
        self._next_drop: asyncio.Future | None = None  # resolved at the next drop: it wakes the waiters
        self._watcher: asyncio.Task | None = None
        self.control = None if control is None else ControlLink(self.ctx, control, keys)
        self._pinger = None if control is None else PingLink(self.ctx, control, keys)
        self.liveness_s = liveness_s  # as Client's: SchedulerUnavailable within 2 x liveness_s (3 x: a restart)
        self._heard = time.monotonic()  # when anything last came from the scheduler
        self._probe: asyncio.Task | None = None  # one liveness PING at a time, shared by every waiter
        self._next_run_probe: asyncio.Task | None = None  # the same for waiters of a next run (shorter PINGs)
        self._futures: dict[str, asyncio.Future] = {}
        self._pongs: dict[int, asyncio.Future] = {}
        self._nonce = itertools.count(1)
        self._reader: asyncio.Task | None = None
        self._incarnation: str | None = None  # of the scheduler's last PONG (None: none yet)
        self._closed = False
        self.unclaimed = 0  # replies for groups nobody awaited (as Client's)

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_drops())

    def _drop_future(self) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if self._next_drop is None or self._next_drop.get_loop() is not loop:
            self._next_drop = loop.create_future()
        return self._next_drop

    async def _watch_drops(self) -> None:
        while True:
            await self._monitor.recv_multipart()
            self._drops += 1
            woken, self._next_drop = self._drop_future(), None
            woken.set_result(None)

    async def _read(self) -> None:
        while self._futures or self._pongs:
            frames = await self._sock.recv_multipart()
            self._heard = time.monotonic()
            try:
                kind, msg = protocol.decode_frames(frames, {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})
            except protocol.ProtocolError as exc:
                # one this client cannot read (a scheduler of another version) fails the group it names: its
                # waiter would wait forever, the scheduler answering every PING
                fut = self._futures.pop(unreadable_id(frames), None)
                if fut is not None and not fut.done():
                    fut.set_exception(unreadable(exc, frames))
                continue
            if kind is protocol.Kind.PONG:
                self._incarnation = msg.incarnation
                fut = self._pongs.pop(msg.nonce, None)
            elif kind is protocol.Kind.ERROR:
                # the scheduler names the group when it can read its id; with none, and several awaited, no
                # waiter can be told it was theirs (make_request checks what it sends, so this is rare)
                fut = self._futures.pop(msg.request_id, None) if msg.request_id else None
                if fut is None and msg.request_id is None and len(self._futures) == 1:
                    fut = self._futures.pop(next(iter(self._futures)))
                if fut is None:
                    log.warning("the scheduler could not read a message and no waiter can be told: %s: %s",
                                msg.error_code, msg.error)
                elif not fut.done():
                    fut.set_exception(ServiceError(msg))
                continue
            else:
                fut = self._futures.pop(msg.request_id, None)
                self.unclaimed += fut is None
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
                await self._answers_ping(self.liveness_s or 1.0)  # which run this goes to: a stopping one is told apart
            sent_to = self._incarnation
            try:
                result = await self._submit_once(request)
            except ConnectionDropped:  # the same run holds it: sent again over the new connection
                resent.append("reconnected")
                continue
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
                self._next_run_probe = self._probe_task(probe_s)
            if await self._shared(self._next_run_probe):
                if nxt.answered_by(self._incarnation):
                    if self._pinger is not None:
                        # found on the control socket, with nothing read from the request socket meanwhile
                        # (its reader stops while nothing is awaited there): what came there (a stopping
                        # run's second answer to the group) is read now, before its PONG, while the group is
                        # not awaited; after the resend it would read as its answer
                        await self.ping(self.liveness_s or 1.0)
                    return
                await asyncio.sleep(0.2)
            else:
                nxt.unanswered()
                await asyncio.sleep(max(0.0, started + probe_s - time.monotonic()))

    async def _shared(self, probe: asyncio.Task) -> bool:
        """A probe's answer, awaited by one of the waiters that share it; cancelled by `close`, it raises
        ClientClosed there rather than a cancellation the caller never asked for."""
        try:
            return await asyncio.shield(probe)
        except asyncio.CancelledError:
            if self._closed and probe.cancelled():
                raise ClientClosed(f"the client of {self.endpoint} was closed") from None
            raise

    async def _submit_once(self, request: protocol.SubmitRequest) -> Result:
        rid = request.request_id
        frames = submit_frames(request)
        if self.liveness_s is not None and self._incarnation is None:
            # once: which run of the scheduler this client talks to ("" when it did not answer: no verdict)
            self._incarnation = self._incarnation if await self._answers_ping(self.liveness_s) else ""
        self._check_open()
        # checked after the PING, with no await before the future is registered: a second submission of the
        # id that raced past the PING would take the first's future, and the first would wait forever
        if rid in self._futures:  # one future an id: the second waiter would never be answered
            raise ValueError(f"{rid!r} is in flight on this client already")
        sent_to, drops = self._incarnation, self._drops
        fut = asyncio.get_running_loop().create_future()
        self._futures[rid] = fut
        try:
            await self._send(frames, rid)
            self._ensure_reader()
            return Result.from_wire(await self._answer(fut, rid, sent_to, drops))
        except asyncio.CancelledError:
            self._raise_if_closed()
            raise
        except zmq.ZMQError:
            self._raise_if_closed()
            raise
        finally:  # answered, given up or cancelled (asyncio.wait_for): a reply that comes later has no taker
            if self._futures.get(rid) is fut:
                del self._futures[rid]
            _retrieved(fut)

    async def _send(self, frames: list[bytes], rid: str) -> None:
        """Send a SUBMIT. With the scheduler away ZMQ queues it, and once the queue is full (1,000
        messages) a send waits until the scheduler is back: with liveness, not longer than the bound
        a waiter would wait for an answer (SchedulerUnavailable)."""
        if self.liveness_s is None:
            await self._sock.send_multipart(frames)
            return
        try:
            await asyncio.wait_for(self._sock.send_multipart(frames), 2 * self.liveness_s)
        except TimeoutError:
            raise SchedulerUnavailable(f"could not send {rid!r} to {self.endpoint} within "
                                       f"{2 * self.liveness_s:.1f} s: the scheduler has been away a while") from None

    async def _answer(self, fut: asyncio.Future, rid: str, sent_to: str | None, drops: int) -> protocol.GroupResult:
        """The reply `fut` gets; SchedulerUnavailable when the scheduler stops answering, or restarted and
        does not hold the group; ConnectionDropped when the connection dropped since it was sent and the
        same run answers (send it again)."""
        while True:
            if self._drops != drops:
                drops = self._drops
                # a reply already read (or read while the probe below waited) is this group's answer: a resend
                # would run it again once the scheduler's kept replies no longer hold it
                if fut.done():
                    return fut.result()
                if await self._same_run(sent_to) and not fut.done():
                    raise ConnectionDropped(f"the connection to {self.endpoint} dropped after {rid!r} was sent; "
                                            "its reply may be lost: send it again under its id")
            # another run answers (a PONG to any waiter's probe says so): decided now, not at the next silence,
            # which never comes while that run answers other groups
            if restarted(sent_to, self._incarnation) and not fut.done():
                if not (await self._held_here(rid) or fut.done()):  # answered meanwhile: taken below
                    raise SchedulerUnavailable(f"the scheduler at {self.endpoint} restarted; {rid!r} was "
                                               "sent to the run before and was not answered")
                sent_to = self._incarnation
            quiet = None if self.liveness_s is None else max(self._heard + self.liveness_s - time.monotonic(), 0.01)
            await asyncio.wait({fut, self._drop_future()}, timeout=quiet, return_when=asyncio.FIRST_COMPLETED)
            if fut.done():
                return fut.result()
            if self._drops != drops or time.monotonic() - self._heard < self.liveness_s:
                continue  # a drop; or other groups' replies came meanwhile: it is alive
            if self._probe is None or self._probe.done():
                self._probe = self._probe_task(self.liveness_s)
            if not await self._shared(self._probe):
                self._incarnation = None  # the next send learns which run answers then
                raise SchedulerUnavailable(f"the scheduler at {self.endpoint} did not answer a PING within "
                                           f"{self.liveness_s:.1f} s; {rid!r} was not answered")
            # answered: by another run, the top of the loop decides

    async def _same_run(self, sent_to: str | None) -> bool:
        """After a drop: whether the run a group was sent to answers (without liveness PINGs, assumed: a
        group sent again is answered once either way). Another run, or none: the usual verdicts decide."""
        if self.liveness_s is None:
            return True
        if self._probe is None or self._probe.done():
            self._probe = self._probe_task(self.liveness_s)
        return await self._shared(self._probe) and not restarted(sent_to, self._incarnation)

    async def _held_here(self, request_id: str) -> bool:
        """Whether the run that answers now has the group (see the class docstring). Asked within
        `liveness_s`, the wait for the link included (every waiter of a restart asks), so a group is given
        up within 3 x liveness_s: the silence, the PING, the STATUS."""
        if self.control is None:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.liveness_s
        # The control socket does not wait for the request socket: asked at once, the new run may not have
        # read yet a SUBMIT ZMQ held while the connection came back, and says "unknown" of a group it is
        # about to run. A PING on the request socket comes back behind it (unanswered in half the time, a
        # burst ahead of it, the STATUS is asked all the same).
        await self.ping(self.liveness_s / 2)
        remaining = max(deadline - loop.time(), 0.001)
        ask = self.control.ask(protocol.Kind.STATUS, protocol.StatusRequest(request_id), remaining)
        try:
            reply = await asyncio.wait_for(ask, remaining)
        except (TimeoutError, zmq.ZMQError):  # no answer in time, or no link: no evidence it is held
            return False
        return reply is not None and reply.ok and reply.state not in (None, "unknown")

    async def submit(self, image: np.ndarray, prompt: str | list[str] = "", resubmit: bool = False,
                     **kwargs: Any) -> Result:
        return await self.submit_request(make_request(image, prompt, **kwargs), resubmit=resubmit)

    def _probe_task(self, timeout_s: float) -> asyncio.Task:
        """A liveness PING every waiter may share (`_shared`); its exception is marked seen, for when
        every waiter has given up on it (`close` fails it with ClientClosed)."""
        probe = asyncio.ensure_future(self._answers_ping(timeout_s))
        probe.add_done_callback(_retrieved)
        return probe

    async def _answers_ping(self, timeout_s: float) -> bool:
        """A liveness probe: PING on the control socket when there is one, else on the request socket
        (`ping`). On the request socket a PING queues behind every SUBMIT sent before it, and a burst of
        big ones over a slow link held it past `liveness_s` while the scheduler was fine."""
        if self._pinger is None:
            return await self.ping(timeout_s)
        self._check_open()
        try:
            pong = await self._pinger.ping(timeout_s)
        except (asyncio.CancelledError, zmq.ZMQError):
            self._raise_if_closed()
            raise
        if pong is None:
            return False
        self._heard = time.monotonic()  # as a PONG on the request socket: no probe before the next silence
        self._incarnation = pong.incarnation
        return True

    async def ping(self, timeout_s: float = 2.0) -> bool:
        """Whether the scheduler answers a PING on the request socket within `timeout_s`, the send included
        (with no scheduler to send to it would wait for one); behind any SUBMIT sent before it."""
        self._check_open()
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
        except (asyncio.CancelledError, zmq.ZMQError):
            self._raise_if_closed()
            raise
        finally:  # answered, timed out or cancelled: a PONG that comes later has nobody to wake
            self._pongs.pop(nonce, None)
            _retrieved(fut)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"the client of {self.endpoint} is closed")

    def _raise_if_closed(self) -> None:
        """Called with a CancelledError (or a ZMQError) in hand: ClientClosed when `close` caused it, not the
        caller. Closing a pyzmq socket cancels the futures of its pending sends and receives (a send waiting
        for room in the queue, a STATUS waiting for its reply), and that cancellation reached the caller as
        its own; a send that began after the close (a call started just before it) raised ZMQError."""
        task = asyncio.current_task()
        if self._closed and (task is None or not task.cancelling()):
            raise ClientClosed(f"the client of {self.endpoint} was closed") from None

    def close(self) -> None:
        """Close the sockets; every call waiting on this client raises ClientClosed."""
        if self._closed:  # closed again: the sockets are gone already
            return
        self._closed = True
        closed = ClientClosed(f"the client of {self.endpoint} was closed")
        for fut in [*self._futures.values(), *self._pongs.values()]:
            if not fut.done():
                fut.set_exception(closed)
        self._futures.clear()
        self._pongs.clear()
        for task in (self._reader, self._watcher, self._probe, self._next_run_probe):
            if task is not None:
                task.cancel()
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(0)
        if self.control is not None:
            self.control.close()
            self._pinger.close()
