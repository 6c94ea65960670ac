"""A worker in trouble never strands what it holds: a real Worker against a scheduler the test plays (one
ROUTER socket, in process). A worker bug on its compute thread answers every held assignment with
worker_error and the worker keeps serving; a compute thread that dies anyway makes the worker leave; a
scheduler away for minutes does not stall its sends; a scheduler that forgot it does not get answers
for work it never sent; an assignment id it already holds is not taken twice (worker/loop.py, link.py)."""

from __future__ import annotations

import time

import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.worker.loop import COMPUTE_FAILED, Worker, WorkerFailed
from candidate_scheduler.worker.null_adapter import NullAdapter, NullGroup
from tests.conftest import wait_for
from tests.integration.played_scheduler import PlayedScheduler


def answers(played: PlayedScheduler, batch_ids: set[int], timeout_s: float = 10.0) -> None:
    """Until every one of `batch_ids` has been answered."""
    deadline = time.monotonic() + timeout_s
    while batch_ids - played.results:
        played.next({protocol.Kind.BATCH_RESULT}, timeout_s=max(0.05, deadline - time.monotonic()))


def last_beat_lists(played: PlayedScheduler) -> list[int]:
    """What the worker's next heartbeat lists as held."""
    return played.next({protocol.Kind.HEARTBEAT})[2].running


class BrokenGroup(NullGroup):
    @property
    def done(self) -> bool:
        if self.step_index >= 3:  # an adapter bug the step loop does not expect: it escapes the turn
            raise KeyError("the adapter lost this group's state")
        return False


class BreaksAfterAStep(NullAdapter):
    """Groups named "broken..." raise out of the step loop after their third step."""

    def start(self, item):
        group = super().start(item)
        return BrokenGroup(**vars(group)) if item.request_id.startswith("broken") else group


class ReleaseRaises(NullAdapter):
    def release(self, group):
        raise RuntimeError("release failed (a sticky device error after a failed forward)")


def test_a_compute_thread_bug_answers_what_it_holds_with_worker_error_and_it_keeps_serving():
    p = PlayedScheduler(0.02, adapter=BreaksAfterAStep(4))
    try:
        p.batch(2, 100, protocol.Kind.JOIN, "bystander")  # 2 s: running when the other one breaks
        p.holding(2)
        p.batch(1, 50, protocol.Kind.JOIN, "broken")
        answers(p, {1, 2})
        for batch_id in (1, 2):  # retried by the scheduler from their snapshots
            [out] = p.outputs[batch_id]
            assert out.status == "error" and out.error_code == "worker_error", out
            assert "compute thread failed" in out.error and "KeyError" in out.error
        p.batch(3, 2)
        answers(p, {3})
        assert [o.status for o in p.outputs[3]] == ["ok"]
        assert last_beat_lists(p) == []
    finally:
        p.close()


def test_an_adapter_whose_release_raises_still_answers_the_cancel_and_the_rest():
    p = PlayedScheduler(0.02, adapter=ReleaseRaises(4))
    try:
        p.batch(1, 100, protocol.Kind.JOIN, "a")
        p.batch(2, 10, protocol.Kind.JOIN, "b")
        p.holding(2)
        p.send(protocol.Kind.CANCEL_ROWS, protocol.CancelRowsMsg(1, ["a"]))
        answers(p, {1, 2})
        assert [o.status for o in p.outputs[1]] == ["cancelled"]
        assert [o.status for o in p.outputs[2]] == ["ok"]
    finally:
        p.close()


class DiesOnItsFirstAssignment(Worker):
    def _compute_loop(self) -> None:
        self._inbox.get(timeout=10)
        raise SystemExit("the compute thread is gone")  # past what its own loop catches


def test_a_worker_whose_compute_thread_died_leaves_so_that_its_work_is_retried_at_once():
    p = PlayedScheduler(worker_cls=DiesOnItsFirstAssignment)
    try:
        p.batch(1, 2)
        _i, _k, left = p.next({protocol.Kind.LEFT}, timeout_s=5)  # not heartbeats listing 1 forever
        assert left.reason == COMPUTE_FAILED and 1 not in p.results
        p.gone(5)
        assert isinstance(p.served, WorkerFailed)  # the process exits non-zero: its supervisor restarts it
    finally:
        p.close()


def test_an_assignment_id_out_of_range_is_refused_and_the_worker_keeps_serving():
    p = PlayedScheduler(0.02)
    try:
        p.batch(-1, 2)  # its answer could not be framed (8 unsigned bytes): refused when decoded
        p.batch(2, 2)
        answers(p, {2})
        assert -1 not in p.results and last_beat_lists(p) == []
    finally:
        p.close()


def test_an_assignment_id_the_worker_holds_already_is_ignored():
    p = PlayedScheduler(0.02)
    try:
        p.batch(1, 30, protocol.Kind.JOIN, "first")
        p.holding(1)
        p.batch(1, 2, protocol.Kind.JOIN, "second")  # the duplicate would take the first one's place
        answers(p, {1})
        assert [o.request_id for o in p.outputs[1]] == ["first"]
        p.batch(3, 2)  # a BATCH waits until nothing runs: the first one's rows were freed
        answers(p, {3}, timeout_s=5)
        assert [o.request_id for o in p.outputs[1]] == ["first"] and last_beat_lists(p) == []
    finally:
        p.close()


def test_told_to_register_again_it_drops_what_it_held_and_the_new_schedulers_work_runs_at_once():
    """The scheduler forgot us (it restarted, or declared us dead and retried our work elsewhere): the
    old work's answers would be discarded as late, so it is dropped, not run ahead of the new work --
    which may reuse the old ids (a restarted scheduler counts afresh)."""
    p = PlayedScheduler(0.05)
    try:
        p.batch(1, 60, protocol.Kind.BATCH, "old")  # 3 s of work
        p.holding(1)
        p.send(protocol.Kind.WORKER_STOP, protocol.WorkerStopMsg("reregister"))
        p.identity, _k, _m = p.next({protocol.Kind.REGISTER})
        p.send(protocol.Kind.REGISTERED, protocol.RegisteredMsg("w", 0.2))
        sent = time.monotonic()
        p.batch(1, 2, protocol.Kind.BATCH, "new")  # 0.1 s of work, under the old one's id
        answers(p, {1})
        assert time.monotonic() - sent < 1.5, "the new scheduler's work waited behind the old"
        assert [o.request_id for o in p.outputs[1]] == ["new"]
        assert last_beat_lists(p) == []
        time.sleep(0.3)  # nothing of the old work comes after (its answer, had it run, at 3 s: not waited for)
        p.sock.poll(0)
        assert [o.request_id for o in p.outputs[1]] == ["new"]
    finally:
        p.close()


@pytest.mark.parametrize("second_sigterm", [False, True])
def test_after_the_scheduler_has_been_away_a_while_a_leave_and_a_stop_still_work(second_sigterm):
    """Heartbeats fill the link's queue while the scheduler is away (1000 of them, about eight minutes at
    two a second; 20 here); a send that waited for room then would stall the worker for good."""
    p = PlayedScheduler(heartbeat_s=0.05, sndhwm=20)
    try:
        p.sock.close(0)  # the scheduler is gone
        time.sleep(2.0)  # 40 heartbeats: the queue is full
        if second_sigterm:
            p.worker.leave(30.0)
            p.worker.leave()
            p.gone(3)
            assert p.worker.left_reason is None
        else:
            p.worker.leave(10.0)
            p.gone(6)  # no answer to LEAVING and nothing held: it goes after its ack timeout (1 s)
            assert p.worker.left_reason == "no_ack"
    finally:
        p.close()


def test_an_answer_the_link_cannot_take_is_kept_and_sent_once_the_scheduler_is_back():
    p = PlayedScheduler(0.05, heartbeat_s=0.05, sndhwm=20)
    back = None
    try:
        p.batch(1, 40)  # 2 s: it ends while the link is full
        p.holding(1)
        p.sock.close(0)
        wait_for(lambda: len(p.worker._outbox) == 1, 10, "the answer waiting for room on the link")
        assert 1 in p.worker._held  # held (and heartbeated) until it has actually gone
        back = p.ctx.socket(zmq.ROUTER)  # the scheduler, back on the same port: the queue drains
        back.setsockopt(zmq.LINGER, 0)
        back.bind(f"tcp://127.0.0.1:{p.port}")
        p.sock = back
        answers(p, {1})
        assert [o.status for o in p.outputs[1]] == ["ok"]
        wait_for(lambda: not p.worker._held and not len(p.worker._outbox), 5, "nothing held once it is sent")
    finally:
        p.close()
