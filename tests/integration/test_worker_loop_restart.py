"""A scheduler that restarted numbers its assignments afresh, so its first ones take the ids of what the
worker still runs for the one before (worker/loop.py, `_forget_work`): nothing that concerns the old
assignment may touch the new one with its id, against a scheduler the test plays."""

from __future__ import annotations

import threading

from candidate_scheduler import protocol
from candidate_scheduler.core.messages import REREGISTER
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.conftest import wait_for
from tests.integration.played_scheduler import PlayedScheduler


class HeldStep(NullAdapter):
    """The last step of group "old" waits for the test: the compute thread is mid-step meanwhile."""

    def __init__(self, rows: int = 4):
        super().__init__(rows)
        self.in_step = threading.Event()
        self.gate = threading.Event()

    def step(self, groups) -> int:
        if any(g.request_id == "old" and g.step_index == g.steps - 1 for g in groups):
            self.in_step.set()
            assert self.gate.wait(10), "the test never let the step go"
        return super().step(groups)


def test_a_cancel_of_the_new_schedulers_assignment_survives_the_old_one_with_its_id_finishing():
    adapter = HeldStep()
    p = PlayedScheduler(0.01, adapter=adapter, heartbeat_s=0.05)
    try:
        p.batch(1, 2, protocol.Kind.BATCH, "old")
        assert adapter.in_step.wait(10)
        # the scheduler restarted: the worker registers again, and the new one's first assignment is 1 too
        p.send(protocol.Kind.WORKER_STOP, protocol.WorkerStopMsg(REREGISTER))
        p.next({protocol.Kind.REGISTER})
        p.send(protocol.Kind.REGISTERED, protocol.RegisteredMsg("w", 0.05))
        p.batch(1, 1000, protocol.Kind.BATCH, "new")  # 10 s
        p.send(protocol.Kind.CANCEL_ROWS, protocol.CancelRowsMsg(1, ["new"]))
        wait_for(lambda: 1 in p.worker._cancelled, 5, "the cancel read")
        adapter.gate.set()  # the old assignment 1 finishes now; its answer is dropped
        p.next({protocol.Kind.BATCH_RESULT}, timeout_s=5)
        assert [(o.request_id, o.status) for o in p.outputs[1]] == [("new", "cancelled")]
    finally:
        adapter.gate.set()
        p.close()
