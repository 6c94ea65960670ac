"""`stop()` (a second SIGTERM, SIGINT) stops at once even when a step does not end (a wedged device): the
worker waited for the step in progress whatever its join timeout said, since terminating its ZMQ context
waits for the compute thread's socket. It now waits STOP_WAIT_S and leaves that thread behind."""

from __future__ import annotations

import threading
import time

import zmq

from candidate_scheduler import protocol
from candidate_scheduler.worker import loop
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.unit.test_worker_cancel_while_conditioning import _assignment


class WedgedStep(NullAdapter):
    """Its first step blocks until the test lets it go."""

    def __init__(self):
        super().__init__(4)
        self.stepping, self.release = threading.Event(), threading.Event()

    def step(self, groups) -> int:
        self.stepping.set()
        self.release.wait(60)
        return super().step(groups)


def test_a_stop_during_a_step_that_does_not_end_returns_after_the_stop_wait(monkeypatch):
    monkeypatch.setattr(loop, "STOP_WAIT_S", 0.3, raising=False)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    adapter = WedgedStep()
    worker = Worker(f"tcp://127.0.0.1:{port}", adapter, worker_id="w", warmup_shapes=[])
    returned: list[float] = []
    thread = threading.Thread(target=lambda: (worker.serve(), returned.append(time.monotonic())), daemon=True)
    thread.start()
    try:
        assert router.poll(10_000), "no REGISTER"
        identity, *_ = router.recv_multipart()
        router.send_multipart([identity, *protocol.encode(protocol.Kind.REGISTERED, protocol.RegisteredMsg("w", 0.5))])
        router.send_multipart([identity, *protocol.encode(protocol.Kind.BATCH, _assignment(1, "g", steps=3))])
        assert adapter.stepping.wait(10), "the step never began"
        stopped = time.monotonic()
        worker.stop()
        thread.join(5)
        assert returned and returned[0] - stopped < 2.0, "serve waited for the step in progress"
    finally:
        adapter.release.set()
        thread.join(10)
        router.close(0)
        ctx.term()
