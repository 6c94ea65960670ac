"""Asyncio links to the scheduler's control socket. `ControlLink`: one request at a time; a reply that
does not come in time drops the socket, so a late reply can never be read as the answer to the next
request. Used by `AsyncClient` (STATUS, when a restart is in doubt) and the openpi front (STATS, CANCEL).
`PingLink`: `AsyncClient`'s liveness PINGs, off the request socket, where they queued behind every
submission sent before them."""

from __future__ import annotations

import asyncio
import itertools

import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.endpoints import ipv6_for
from candidate_scheduler.service.keys import ClientKeys
from candidate_scheduler.service.replies import ClientClosed


def _dealer(ctx: zmq.asyncio.Context, endpoint: str, keys: ClientKeys | None) -> zmq.asyncio.Socket:
    sock = ipv6_for(ctx.socket(zmq.DEALER), endpoint)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.apply(sock)
    sock.connect(endpoint)
    return sock


class ControlLink:
    """The scheduler's control socket, from asyncio."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, keys: ClientKeys | None = None):
        self.ctx, self.endpoint, self.keys = ctx, endpoint, keys
        self._sock: zmq.asyncio.Socket | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def ask(self, kind: protocol.Kind, payload, timeout_s: float) -> protocol.ControlReply | None:
        """The reply to one request, or None when none came within `timeout_s`. The wait for the link is
        part of it: with the scheduler away each ask waits out its timeout, and the Nth caller queued
        behind the others waited N of them. ClientClosed when the link is closed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if not await self._turn(timeout_s):
            return None
        try:
            if self._closed:  # closed while this ask waited its turn: no socket is opened again
                raise ClientClosed(f"the control link to {self.endpoint} is closed")
            if self._sock is None:
                self._sock = _dealer(self.ctx, self.endpoint, self.keys)
            try:
                # a send finding no peer to queue for waits for one: within the same timeout
                await asyncio.wait_for(self._sock.send_multipart(protocol.encode(kind, payload)),
                                       max(deadline - loop.time(), 0.001))
                if not await self._sock.poll(max(int((deadline - loop.time()) * 1000), 0)):
                    self._drop()
                    return None
                frames = await self._sock.recv_multipart()
            except TimeoutError:
                self._drop()
                return None
            except BaseException as exc:
                # cancelled (or failed) with its reply still to come: that reply must never be read as the
                # answer to the next request, so the socket goes with it
                self._drop()
                task = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and self._closed and not (task and task.cancelling()):
                    # closing the socket cancelled its wait, not the caller: said as what it is
                    raise ClientClosed(f"the control link to {self.endpoint} was closed") from None
                raise
        finally:
            self._lock.release()
        try:
            reply_kind, msg = protocol.decode_frames(frames, {protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR})
        except protocol.ProtocolError:
            return None
        return msg if reply_kind is protocol.Kind.CONTROL_REPLY else None

    async def _turn(self, timeout_s: float) -> bool:
        """Take the link within `timeout_s` (False: not in time, and not held)."""
        acquire = asyncio.ensure_future(self._lock.acquire())
        try:
            done, _ = await asyncio.wait({acquire}, timeout=timeout_s)
        except BaseException:  # the caller was cancelled while it waited its turn
            self._abandon(acquire)
            raise
        if done:
            return True
        self._abandon(acquire)
        return False

    def _abandon(self, acquire: asyncio.Future) -> None:
        """Give up a wait for the link: if it took the lock all the same (as it was given up), hand it back."""
        def hand_back(task: asyncio.Future) -> None:
            if not task.cancelled() and task.exception() is None and task.result():
                self._lock.release()

        acquire.add_done_callback(hand_back)
        acquire.cancel()

    def _drop(self) -> None:
        """Close the socket; the next ask opens another."""
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def close(self) -> None:
        """Close the link for good: an ask still waiting its turn raises ClientClosed, as does a later one."""
        self._closed = True
        self._drop()


class PingLink:
    """PINGs on the scheduler's control socket, many in flight at once on one socket of their own: a PONG
    names its PING's nonce, so a late one is told apart and dropped. Not on a `ControlLink`: its one ask at
    a time would put a PING behind every STATUS and CANCEL queued there (the openpi front's, each a round
    trip on a slow link)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, keys: ClientKeys | None = None):
        self.ctx, self.endpoint, self.keys = ctx, endpoint, keys
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._waiting: dict[int, asyncio.Future] = {}  # nonce -> its PONG, for the PINGs in flight
        self._nonce = itertools.count(1)
        self._closed = False

    async def ping(self, timeout_s: float) -> protocol.Pong | None:
        """The PONG to one PING, or None when none came within `timeout_s`, the send included (with no
        scheduler to send to it would wait for one). ClientClosed when the link is closed first."""
        self._check_open()
        if self._sock is None:
            self._sock = _dealer(self.ctx, self.endpoint, self.keys)
        sock, nonce = self._sock, next(self._nonce)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[nonce] = fut

        async def send_and_wait() -> protocol.Pong:
            await sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(nonce)))
            if self._reader is None or self._reader.done():
                self._reader = asyncio.ensure_future(self._read(sock))
            return await fut

        try:
            return await asyncio.wait_for(send_and_wait(), timeout_s)
        except TimeoutError:
            if not self._waiting.keys() - {nonce}:
                # none other in flight: the socket goes, so a wedged connection is not kept, and PINGs
                # queued for an absent scheduler are not delivered to its next run
                self._drop()
            return None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and not (task and task.cancelling()):
                # closing the socket cancelled its wait, not the caller: said as what it is
                raise ClientClosed(f"the control link to {self.endpoint} was closed") from None
            raise
        finally:  # answered, timed out or cancelled: a PONG that comes later has nobody to wake
            self._waiting.pop(nonce, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # seen: close() fails it, maybe after its caller gave up

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        """Hand each PONG to its PING; ends when none waits (the next PING starts another)."""
        while self._waiting and sock is self._sock:
            frames = await sock.recv_multipart()
            try:
                kind, msg = protocol.decode_frames(frames, {protocol.Kind.PONG, protocol.Kind.ERROR})
            except protocol.ProtocolError:
                continue  # not a PONG this link can read: its PING is unanswered
            fut = self._waiting.pop(msg.nonce, None) if kind is protocol.Kind.PONG else None
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"the control link to {self.endpoint} is closed")

    def _drop(self) -> None:
        """Close the socket (and stop its reader); the next PING opens another."""
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def close(self) -> None:
        """Close the link for good: every PING waiting on it raises ClientClosed, as does a later one."""
        self._closed = True
        closed = ClientClosed(f"the control link to {self.endpoint} was closed")
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(closed)
        self._waiting.clear()
        self._drop()
