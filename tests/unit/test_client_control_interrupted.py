"""The blocking Client's control requests after one was interrupted while it waited (Ctrl-C at a prompt,
a SIGTERM handler, a signal-based test timeout): the interrupted request's reply still comes, and was
read as the answer to the next request, and every later one was answered the reply of the one before
(`status("b")` answered with what `stats()` was told). A control wait cut short by anything drops its
socket now, as a timed-out one does and as the asyncio ControlLink does when its ask is cancelled."""

from __future__ import annotations

import signal
import threading

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.client import Client, make_request


class Interrupted(Exception):
    pass


class SlowControl:
    """A control socket the test plays: the first request (a PING too) is answered only when `release` is
    set; each later one at once. Each reply's state names the request it answers."""

    def __init__(self):
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.release, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        first = True
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            identity, delimited, kind, payload = protocol.split_envelope(self.router.recv_multipart(),
                                                                         protocol.CONTROL_KINDS)
            msg = protocol.decode(kind, payload)
            if first:
                first = False
                while not (self.release.is_set() or self._stop.is_set()):
                    self.release.wait(0.02)
            if kind is protocol.Kind.PING:
                reply = protocol.Kind.PONG, protocol.Pong(msg.nonce, incarnation="A")
            else:
                reply = protocol.Kind.CONTROL_REPLY, protocol.ControlReply(True, state=f"for-{msg.request_id}")
            self.router.send_multipart(protocol.reply_frames(identity, delimited, *reply))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.router.close(0)


def _interrupt_after(seconds: float):
    def raise_interrupted(_signum, _frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, raise_interrupted)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return previous


def test_a_control_request_after_an_interrupted_one_gets_its_own_reply():
    control = SlowControl()
    previous = _interrupt_after(0.1)
    try:
        with Client("tcp://127.0.0.1:9", control.endpoint, liveness_s=None) as c:
            try:
                c.status("a", None)  # interrupted while it waits for its (slow) reply
                raise AssertionError("not interrupted")
            except Interrupted:
                pass
            control.release.set()  # the interrupted request's reply comes after all
            assert c.status("b").state == "for-b"  # it was "for-a"
            assert c.status("c").state == "for-c"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        control.close()


def test_a_control_request_after_an_interrupted_liveness_ping_gets_its_own_reply():
    """The first send's PING goes to the control socket; interrupted, its PONG came later and was read as
    the answer to the next control request (a ProtocolError: PONG is no control reply), whose own reply
    then answered the request after it."""
    control = SlowControl()
    previous = _interrupt_after(0.1)
    try:
        with Client("tcp://127.0.0.1:9", control.endpoint, liveness_s=5.0) as c:
            try:
                c.send(make_request(np.zeros((8, 8, 3), np.uint8), "pick", request_id="g"))
                raise AssertionError("not interrupted")
            except Interrupted:
                pass
            control.release.set()
            assert c.status("b").state == "for-b"
            assert c.status("c").state == "for-c"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        control.close()
