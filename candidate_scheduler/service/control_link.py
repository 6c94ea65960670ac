"""An asyncio link to the scheduler's control socket: one request at a time; a reply that does not
come in time drops the socket, so a late reply can never be read as the answer to the next request.
Used by `AsyncClient` (STATUS, when a restart is in doubt) and the openpi front (STATS, CANCEL)."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.keys import ClientKeys


class ControlLink:
    """The scheduler's control socket, from asyncio."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, keys: ClientKeys | None = None):
        self.ctx, self.endpoint, self.keys = ctx, endpoint, keys
        self._sock: zmq.asyncio.Socket | None = None
        self._lock = asyncio.Lock()

    async def ask(self, kind: protocol.Kind, payload, timeout_s: float) -> protocol.ControlReply | None:
        async with self._lock:
            if self._sock is None:
                self._sock = self.ctx.socket(zmq.DEALER)
                self._sock.setsockopt(zmq.LINGER, 0)
                if self.keys is not None:
                    self.keys.apply(self._sock)
                self._sock.connect(self.endpoint)
            try:
                await self._sock.send_multipart(protocol.encode(kind, payload))
                if not await self._sock.poll(int(timeout_s * 1000)):
                    self.close()
                    return None
                frames = await self._sock.recv_multipart()
            except BaseException:
                # cancelled (or failed) with its reply still to come: that reply must never be read as the
                # answer to the next request, so the socket goes with it
                self.close()
                raise
        try:
            reply_kind, msg = protocol.decode_frames(frames, {protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR})
        except protocol.ProtocolError:
            return None
        return msg if reply_kind is protocol.Kind.CONTROL_REPLY else None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
