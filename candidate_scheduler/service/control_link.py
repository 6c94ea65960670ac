"""An asyncio link to the scheduler's control socket: one request at a time; a reply that does not
come in time drops the socket, so a late reply can never be read as the answer to the next request.
Used by `AsyncClient` (STATUS, when a restart is in doubt) and the openpi front (STATS, CANCEL)."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.keys import ClientKeys
from candidate_scheduler.service.replies import ClientClosed


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
                self._sock = self.ctx.socket(zmq.DEALER)
                self._sock.setsockopt(zmq.LINGER, 0)
                if self.keys is not None:
                    self.keys.apply(self._sock)
                self._sock.connect(self.endpoint)
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
