"""The blocking Client across a restart of its scheduler: a group lost to the restart is given up as soon
as the PING after the connection drop says another run answers, not once the replies of the groups the
client sent since have stopped coming (they reset its silence, and the verdict waited for one)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.client import Client, SchedulerUnavailable, make_request
from tests.unit.test_client_replies import result

IMAGE = np.zeros((8, 8, 3), np.uint8)


class Restarting:
    """A scheduler the test plays: PINGs answered at once with its incarnation; the SUBMIT of `lost`
    restarts it (its connection drops, run B listens on the same address, A's groups are gone); every other
    group is answered 0.1 s after the one before (a run working through its queue)."""

    def __init__(self):
        self.ctx = zmq.Context.instance()
        self.router = self._listen("tcp://127.0.0.1:0")
        self.endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.incarnation, self.due = "A", []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _listen(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        for _ in range(100):  # ZMQ closes the old listener on its own thread, a moment later
            try:
                sock.bind(endpoint)
                return sock
            except zmq.ZMQError:
                time.sleep(0.01)
        raise RuntimeError(f"could not listen on {endpoint}")

    def _serve(self) -> None:
        while not self._stop.is_set():
            while self.due and self.due[0][0] <= time.monotonic():
                _, ident, rid = self.due.pop(0)
                self.router.send_multipart([ident, *protocol.encode(protocol.Kind.RESULT, result(rid))])
            if not self.router.poll(10):
                continue
            ident, header, payload = self.router.recv_multipart()
            kind = protocol.parse_header(header, protocol.REQUEST_KINDS)
            msg = protocol.decode(kind, payload)
            if kind is protocol.Kind.PING:
                pong = protocol.Pong(msg.nonce, incarnation=self.incarnation)
                self.router.send_multipart([ident, *protocol.encode(protocol.Kind.PONG, pong)])
            elif msg.request_id == "lost":
                self.router.close(0)
                self.router, self.incarnation, self.due = self._listen(self.endpoint), "B", []
            else:
                after = self.due[-1][0] if self.due else time.monotonic()
                self.due.append((after + 0.1, ident, msg.request_id))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.router.close(0)


def test_a_group_lost_to_a_restart_is_given_up_while_later_groups_are_answered():
    played = Restarting()
    try:
        with Client(played.endpoint, liveness_s=0.3) as c:
            assert c.ping(1)
            c.send(make_request(IMAGE, "pick", request_id="lost"))
            time.sleep(0.3)  # the restart
            for i in range(20):
                c.send(make_request(IMAGE, "pick", request_id=f"later-{i}"))
            started = time.monotonic()
            with pytest.raises(SchedulerUnavailable, match="restarted"):
                c.wait("lost", 10)
            took = time.monotonic() - started
            assert took < 1.0, took  # it waited out the 2 s the later groups' replies took, and a PING
            assert all(c.wait(f"later-{i}", 5).ok for i in range(20))
    finally:
        played.close()
