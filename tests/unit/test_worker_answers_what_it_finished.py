"""Every assignment a worker finishes is answered, even when answering it goes wrong (worker/loop.py,
worker/running.py): the real compute thread against the I/O thread's end of its inproc pipe (no scheduler,
no TCP). An assignment taken off the running batch and never answered is lost for good: the I/O thread
still holds it, so heartbeats list it forever and the scheduler never retries it."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import zmq

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter
from candidate_scheduler.worker.running import arrival_from_wire


def _assignment(batch_id: int, *request_ids: str, steps: int = 2) -> protocol.BatchMsg:
    sampling = convert.sampling_to_wire(SamplingSpec(steps=steps))
    groups = [protocol.GroupWorkMsg(rid, protocol.array_to_wire(np.zeros((1, 16, 16, 3), np.uint8)), ["pick"],
                                    sampling, [protocol.CandidateMsg(0, 3)]) for rid in request_ids]
    return protocol.BatchMsg(batch_id, groups)


@contextlib.contextmanager
def compute_thread(adapter):
    """A worker's compute thread; yields (send an assignment, the next answer's (batch id, outputs))."""
    worker = Worker("tcp://127.0.0.1:1", adapter, worker_id="w", warmup_shapes=[])
    wake = worker.ctx.socket(zmq.PAIR)
    wake.bind(worker._wake_addr)
    thread = threading.Thread(target=worker._compute_loop, daemon=True)
    thread.start()

    def send(msg: protocol.BatchMsg) -> None:
        worker._inbox.put(arrival_from_wire(msg, protocol.Kind.JOIN, 0.0))

    def answer(timeout_s: float = 5.0) -> tuple[int, list[tuple[str, str, str | None]]]:
        assert wake.poll(int(timeout_s * 1000)), "no answer came"
        _tag, *frames = wake.recv_multipart()
        kind, msg = protocol.decode_frames(frames, protocol.WORKER_KINDS)
        assert kind is protocol.Kind.BATCH_RESULT
        return msg.batch_id, [(o.request_id, o.status, o.error_code) for o in msg.outputs]

    try:
        yield send, answer
    finally:
        worker.stop()
        worker._inbox.put(None)
        thread.join(10)
        wake.close(0)
        worker.ctx.term()


class FinishReturnsNothing(NullAdapter):
    """An adapter bug: `finish` of group "broken" returns None instead of a GroupOutput."""

    def finish(self, group):
        return None if group.request_id == "broken" else super().finish(group)


def test_a_finish_that_returns_no_output_fails_its_own_group_and_the_assignment_is_answered():
    with compute_thread(FinishReturnsNothing(4)) as (send, answer):
        send(_assignment(1, "good", "broken"))
        batch_id, outputs = answer()
        assert batch_id == 1
        assert outputs[0] == ("good", "ok", None)
        assert outputs[1][:2] == ("broken", "error") and outputs[1][2] == "model_error"


class BadHook(NullAdapter):
    """The worker's answer hook (fault injection's `mangle_result`) fails for assignments holding "cursed",
    and makes outputs nothing can encode, not even as an error, for those holding "garbage"."""

    def mangle_result(self, items, outputs):
        if any(it.request_id == "cursed" for it in items):
            raise RuntimeError("the answer hook failed")
        if any(it.request_id == "garbage" for it in items):
            return [None for _ in outputs]
        return outputs


def test_an_assignment_whose_answering_fails_is_still_answered_and_so_are_those_after_it():
    with compute_thread(BadHook(4)) as (send, answer):
        send(_assignment(1, "cursed", steps=3))
        send(_assignment(2, "plain", steps=3))  # beside it, ending at the same step or the next
        got = dict([answer(), answer()])
        assert got[1] == [("cursed", "ok", None)]  # the outputs it had, answered without the hook
        assert got[2] == [("plain", "ok", None)]
        send(_assignment(3, "after"))  # the worker serves on
        assert answer() == (3, [("after", "ok", None)])


def test_an_assignment_whose_answer_cannot_be_made_at_all_is_answered_with_what_it_computed():
    with compute_thread(BadHook(4)) as (send, answer):
        send(_assignment(1, "garbage"))
        assert answer() == (1, [("garbage", "ok", None)])  # `_abandon`: the outputs it had
        send(_assignment(2, "after"))
        assert answer() == (2, [("after", "ok", None)])
