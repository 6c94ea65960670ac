"""The worker's end of the worker link: one DEALER, and sends that never block the I/O thread.

A DEALER queues what it sends while the scheduler is away (ZMQ reconnects by itself), up to its send
high-water mark (1000 messages); after that a blocking send waits until the scheduler comes back. At two
heartbeats a second that is about eight minutes of outage, and then the I/O thread stalls: no SIGTERM
leave, no second SIGTERM, no cancel. So every send here is non-blocking, and what happens to a message
the link cannot take now depends on what it is:

- heartbeats, REGISTER and LEAVING are dropped: each is sent again on its own schedule;
- results and GIVE_BACK go through `Outbox`, in order, and are tried again at every turn of the loop;
  the worker keeps holding (and heartbeating) an assignment until its answer has actually been sent;
- LEFT, the last word, is given up on: the scheduler retries what the worker held when its heartbeats
  stop.
"""

from __future__ import annotations

from collections import deque

import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.endpoints import ipv6_for


def connect(ctx: zmq.Context, endpoint: str, identity: str, curve_dir: str | None) -> zmq.Socket:
    sock = ipv6_for(ctx.socket(zmq.DEALER), endpoint)
    sock.setsockopt(zmq.LINGER, 0)
    try:  # closed if it cannot connect: the raised error's traceback keeps it open, and `ctx.term()` waits for it
        sock.setsockopt(zmq.IDENTITY, identity.encode())
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if curve_dir is not None:
            from candidate_scheduler.service.keys import ClientKeys, worker_key_name

            ClientKeys.load(curve_dir, worker_key_name(curve_dir)).apply(sock)
        sock.connect(endpoint)
    except BaseException:
        sock.close()
        raise
    return sock


def try_send(sock: zmq.Socket, frames: list[bytes]) -> bool:
    """Send now or not at all; False: the link is full (the scheduler has been away a while)."""
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)  # a multipart message is taken whole or not at all
    except zmq.Again:
        return False
    return True


class Outbox:
    """Answers (BATCH_RESULT, GIVE_BACK) the link could not take yet, oldest first. It holds at most one
    answer per assignment the worker holds, so it needs no bound of its own."""

    def __init__(self) -> None:
        self._waiting: deque[tuple[int, list[bytes]]] = deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, batch_id: int, frames: list[bytes]) -> None:
        self._waiting.append((batch_id, frames))

    def flush(self, sock: zmq.Socket) -> list[int]:
        """Send what the link takes, in order; the assignment ids answered."""
        sent = []
        while self._waiting:
            batch_id, frames = self._waiting[0]
            if not try_send(sock, frames):
                break
            self._waiting.popleft()
            sent.append(batch_id)
        return sent

    def clear(self) -> None:
        self._waiting.clear()
