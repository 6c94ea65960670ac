"""A group conditioned early (its assignment waits for the worker's rows, worker/running.py) that runs out
of memory there was out of memory beside the rows that run, not at its own: it must not be answered
out_of_memory (the scheduler would shrink the worker's rows for it) but started again at its own rows --
also when its rows freed while its start was still under way, so that it was admitted before the failed
start came back."""

from __future__ import annotations

import queue
import threading

import numpy as np

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import GroupWork, SamplingSpec
from candidate_scheduler.worker import stepping
from candidate_scheduler.worker.preparing import Preparer
from candidate_scheduler.worker.running import RunningBatch, SlotState
from tests.unit.test_preparing import Group, HeldAdapter


class Adapter(HeldAdapter):
    """The first start of "next" waits at a gate the test opens, then runs out of memory."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.began = threading.Event()
        self.starts: list[str] = []

    def capability_dict(self) -> dict:
        return {"max_candidates_per_batch": 1}

    def start(self, item: GroupWork) -> Group:
        self.starts.append(item.request_id)
        if item.request_id == "next" and self.starts.count("next") == 1:
            self.began.set()
            assert self.gate.wait(10), "the test never let the start go"
            raise stepping.OutOfMemory("CUDA out of memory (beside the running rows)")
        return Group(item.request_id, item.sampling.steps)


def _assignment(batch_id: int, request_id: str, steps: int) -> protocol.BatchMsg:
    sampling = convert.sampling_to_wire(SamplingSpec(height=16, width=16, steps=steps))
    group = protocol.GroupWorkMsg(request_id, protocol.array_to_wire(np.zeros((1, 16, 16, 3), np.uint8)), ["pick"],
                                  sampling, [protocol.CandidateMsg(0, 7)])
    return protocol.BatchMsg(batch_id, [group])


def test_an_early_start_out_of_memory_that_comes_back_after_admission_starts_again_instead_of_failing():
    adapter = Adapter()
    inbox: queue.Queue = queue.Queue()
    preparer = Preparer(adapter.start, inbox.put)
    try:
        batch = RunningBatch(adapter, 1, preparer=preparer)
        batch.admit(_assignment(1, "running", steps=2), 0.0)
        batch.admit(_assignment(2, "next", steps=2), 0.0)  # no row for it: conditioned early, beside "running"
        assert adapter.began.wait(10)
        batch.step(), batch.step()  # "running" ends while the early start is still under way ...
        assert [a.batch_id for a in batch.take_done()] == [1]
        waiting = batch.assignments[2]
        assert waiting.admitted and waiting.slots[0].state is SlotState.PREPARING  # ... and "next" has its row
        adapter.gate.set()
        batch.prepared(inbox.get(timeout=10))  # the early start ran out of memory beside "running"
        assert not waiting.complete, f"answered {waiting.outputs[0]}: the worker would be shrunk for it"
        done = []
        for _ in range(10):
            while not inbox.empty():
                batch.prepared(inbox.get_nowait())
            batch.step()
            done += batch.take_done()
            if done:
                break
        [answer] = done
        assert answer.batch_id == 2 and answer.outputs[0].status == "ok"
        assert adapter.starts == ["running", "next", "next"]  # started again, at its own row
    finally:
        preparer.close()
