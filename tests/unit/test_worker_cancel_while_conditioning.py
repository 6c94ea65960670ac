"""A cancel (or a leave's give-back) is acted on at once even while the worker's compute thread has nothing
to step and waits for the conditioning thread (worker/loop.py, `_take_new`): the real compute and
conditioning threads, the scheduler's messages handed to the I/O side's handler by the test (no TCP)."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import zmq

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.worker.leaving import Departure
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter


class HeldStart(NullAdapter):
    """The start of group "slow" waits until the test opens `gate`; group "long" takes its last step only
    once that start is under way (so "slow" is conditioned aside, and nothing runs after "long")."""

    def __init__(self):
        super().__init__(4)
        self.gate = threading.Event()
        self.began = threading.Event()

    def start(self, item):
        if item.request_id == "slow":
            self.began.set()
            assert self.gate.wait(20), "the test never let the start go"
        return super().start(item)

    def step(self, groups) -> int:
        if any(g.request_id == "long" and g.step_index == g.steps - 1 for g in groups):
            assert self.began.wait(20), "the start of the group conditioned aside never began"
        return super().step(groups)


def _assignment(batch_id: int, request_id: str, steps: int) -> protocol.BatchMsg:
    sampling = convert.sampling_to_wire(SamplingSpec(steps=steps))
    group = protocol.GroupWorkMsg(request_id, protocol.array_to_wire(np.zeros((1, 16, 16, 3), np.uint8)), ["pick"],
                                  sampling, [protocol.CandidateMsg(0, 3)])
    return protocol.BatchMsg(batch_id, [group])


@contextlib.contextmanager
def worker_with(adapter: HeldStart):
    """(the scheduler's message to the I/O side, the next thing the compute thread sends: (kind, msg))"""
    worker = Worker("tcp://127.0.0.1:1", adapter, worker_id="w", warmup_shapes=[])
    wake = worker.ctx.socket(zmq.PAIR)
    wake.bind(worker._wake_addr)
    thread = threading.Thread(target=worker._compute_loop, daemon=True)
    thread.start()

    def tell(kind: protocol.Kind, msg) -> None:
        assert not worker._on_message(None, protocol.encode(kind, msg))

    def sent(timeout_s: float = 5.0):
        assert wake.poll(int(timeout_s * 1000)), "the compute thread sent nothing"
        _tag, *frames = wake.recv_multipart()
        return protocol.decode_frames(frames, protocol.WORKER_KINDS)

    try:
        yield worker, tell, sent
    finally:
        adapter.gate.set()
        worker.stop()
        worker._inbox.put(None)
        thread.join(10)
        wake.close(0)
        worker.ctx.term()


def test_a_cancel_of_a_group_being_conditioned_is_answered_while_nothing_else_runs():
    adapter = HeldStart()
    with worker_with(adapter) as (_worker, tell, sent):
        tell(protocol.Kind.JOIN, _assignment(1, "long", steps=5))
        tell(protocol.Kind.JOIN, _assignment(2, "slow", steps=5))  # "long" runs: conditioned aside, held there
        kind, msg = sent()
        assert kind is protocol.Kind.BATCH_RESULT and msg.batch_id == 1  # nothing runs now; "slow" is not ready
        tell(protocol.Kind.CANCEL_ROWS, protocol.CancelRowsMsg(2, ["slow"]))
        kind, msg = sent()  # before its start ends (the gate opens only when the test is over)
        assert kind is protocol.Kind.BATCH_RESULT and msg.batch_id == 2
        assert [(o.request_id, o.status) for o in msg.outputs] == [("slow", "cancelled")]


def test_a_leave_gives_back_what_waits_while_the_compute_thread_waits_for_the_conditioning_thread():
    adapter = HeldStart()
    with worker_with(adapter) as (worker, tell, sent):
        tell(protocol.Kind.JOIN, _assignment(1, "long", steps=5))
        tell(protocol.Kind.JOIN, _assignment(2, "slow", steps=5))  # admitted beside "long", conditioned aside
        tell(protocol.Kind.BATCH, _assignment(3, "next", steps=5))  # a BATCH waits until nothing else is held
        kind, msg = sent()
        assert kind is protocol.Kind.BATCH_RESULT and msg.batch_id == 1
        worker._departure = Departure(30.0, time.monotonic(), 1.0)  # the I/O loop's, once it has said LEAVING
        tell(protocol.Kind.LEAVE_ACK, protocol.LeaveAckMsg([2, 3], give_back=True))
        kind, msg = sent()  # before "slow"'s start ends
        assert kind is protocol.Kind.GIVE_BACK and msg.batch_ids == [3]
