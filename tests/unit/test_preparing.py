"""Conditioning off the step loop (worker/preparing.py, worker/running.py): groups that arrive are
started on the conditioning thread while the running batch keeps stepping. A fake step adapter whose
`start` can be held stands in for the model (no sockets: the running batch and the preparer alone)."""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import BatchReport, GroupOutput, GroupWork, SamplingSpec
from candidate_scheduler.worker import stepping
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.preparing import Prepared, Preparer
from candidate_scheduler.worker.running import RunningBatch, SlotState, arrival_from_wire


@dataclass
class Group:
    request_id: str
    steps: int
    rows: int = 1
    step_index: int = 0
    report: BatchReport = field(default_factory=BatchReport)

    @property
    def done(self) -> bool:
        return self.step_index >= self.steps


class HeldAdapter:
    """start() of a group whose request id is in `held` waits until the test lets it go."""

    concurrent_start = True

    def __init__(self):
        self.held: dict[str, threading.Event] = {}
        self.began: dict[str, threading.Event] = {}  # set when a held start is under way (waits at its gate)
        self.started_on: dict[str, str] = {}
        self.released: list[str] = []
        self.out_of_memory: set[str] = set()  # the next start of these runs out of memory

    def hold(self, request_id: str) -> threading.Event:
        self.held[request_id] = threading.Event()
        self.began[request_id] = threading.Event()
        return self.held[request_id]

    def under_way(self, request_id: str) -> None:
        """Until the held start of `request_id` has begun: a start still queued is never run once its
        group is let go of (`Preparer.forget`), one under way is delivered and released."""
        assert self.began[request_id].wait(10), f"the start of {request_id} never began"

    def capability_dict(self) -> dict:
        return {"max_candidates_per_batch": 8}

    def start(self, item: GroupWork) -> Group:
        gate = self.held.get(item.request_id)
        if gate is not None:
            self.began[item.request_id].set()
            assert gate.wait(10), "the test never let this start go"
        self.started_on[item.request_id] = threading.current_thread().name
        if item.request_id.startswith("bad"):
            raise stepping.BadRequest("bad_request", "this group cannot run")
        if item.request_id in self.out_of_memory:
            self.out_of_memory.discard(item.request_id)
            raise stepping.OutOfMemory("CUDA out of memory (the test's)")
        return Group(item.request_id, item.sampling.steps)

    def step(self, groups) -> int:
        for g in groups:
            g.step_index += 1
        return 1

    def finish(self, group: Group) -> GroupOutput:
        return GroupOutput(group.request_id, "ok", [0], np.zeros((1, 1, 1, 1), np.float32))

    def release(self, group: Group) -> None:
        self.released.append(group.request_id)


def _assignment(batch_id: int, *request_ids: str, steps: int = 20) -> protocol.BatchMsg:
    image = np.zeros((1, 16, 16, 3), np.uint8)
    sampling = convert.sampling_to_wire(SamplingSpec(height=16, width=16, steps=steps))
    groups = [protocol.GroupWorkMsg(rid, protocol.array_to_wire(image), ["pick"], sampling,
                                    [protocol.CandidateMsg(0, 7)]) for rid in request_ids]
    return protocol.BatchMsg(batch_id, groups)


@pytest.fixture
def prepared_batch():
    adapter = HeldAdapter()
    inbox: queue.Queue = queue.Queue()
    preparer = Preparer(adapter.start, inbox.put)
    batch = RunningBatch(adapter, preparer=preparer)

    def back(timeout_s: float = 10.0) -> Prepared:
        done = inbox.get(timeout=timeout_s)
        batch.prepared(done)
        return done

    yield adapter, batch, back
    preparer.close()


def _running(batch: RunningBatch) -> dict[str, int]:
    return {g.request_id: g.step_index for a in batch.assignments.values() for g in a.running.values()}


def _with_a_running_group(adapter, batch, steps: int = 50) -> None:
    """With nothing running a start runs on the compute thread (nothing to overlap it with)."""
    batch.admit(_assignment(99, "long", steps=steps), 0.0)
    assert _running(batch) == {"long": 0} and adapter.started_on["long"] == threading.current_thread().name


def test_running_groups_keep_stepping_while_a_joiner_is_conditioned(prepared_batch):
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch)
    gate = adapter.hold("joiner")
    batch.admit(_assignment(2, "joiner"), 0.0)
    for _ in range(5):  # the joiner's start is held: the long group steps on regardless
        batch.step()
    assert _running(batch) == {"long": 5}
    gate.set()
    back()
    batch.step()
    assert _running(batch) == {"long": 6, "joiner": 1}
    assert adapter.started_on["joiner"] == "conditioning"
    assert batch.assignments[2].wire_report()["steps_while_conditioned"] == 5  # the reply says so too


def test_the_groups_of_one_assignment_join_together(prepared_batch):
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch)
    gate = adapter.hold("second")
    batch.admit(_assignment(1, "first", "second"), 0.0)
    assert back().index == 0
    batch.step()
    assert _running(batch) == {"long": 1}  # the first waits for the second
    gate.set()
    assert back().index == 1
    batch.step()
    assert _running(batch) == {"long": 2, "first": 1, "second": 1}  # in lockstep from their first step


def test_with_nothing_running_the_compute_thread_starts_the_groups_itself(prepared_batch):
    adapter, batch, back = prepared_batch
    batch.admit(_assignment(1, "a", "b"), 0.0)
    assert _running(batch) == {"a": 0, "b": 0} and not batch.waiting
    assert set(adapter.started_on.values()) == {threading.current_thread().name}
    assert batch.assignments[1].wire_report()["steps_while_conditioned"] == 0


def test_a_group_cancelled_while_it_is_conditioned_is_answered_at_once_and_released_later(prepared_batch):
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch)
    gate = adapter.hold("slow")
    batch.admit(_assignment(1, "slow"), 0.0)
    adapter.under_way("slow")
    batch.drop({1: {"slow"}})
    [done] = batch.take_done()
    assert done.outputs[0].status == "cancelled"
    gate.set()
    back()  # the group its start made is dropped, never run
    assert adapter.released == ["slow"] and list(batch.assignments) == [99] and _running(batch) == {"long": 0}


def test_a_cancelled_sibling_lets_the_rest_of_its_assignment_join(prepared_batch):
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch)
    gate = adapter.hold("slow")
    batch.admit(_assignment(1, "fast", "slow"), 0.0)
    back()
    adapter.under_way("slow")
    batch.drop({1: {"slow"}})
    assert _running(batch) == {"long": 0, "fast": 0}
    gate.set()
    back()
    assert adapter.released == ["slow"] and _running(batch) == {"long": 0, "fast": 0}
    gate = adapter.hold("waiting")
    batch.admit(_assignment(2, "ready", "waiting"), 0.0)
    back()
    adapter.under_way("waiting")
    batch.drop({2: {"ready", "waiting"}})  # a prepared group waiting for a sibling is released when cancelled too
    [done] = batch.take_done()
    assert [o.status for o in done.outputs.values()] == ["cancelled", "cancelled"]
    assert adapter.released == ["slow", "ready"]
    gate.set()
    back()
    assert adapter.released == ["slow", "ready", "waiting"]


def test_a_start_that_fails_on_the_conditioning_thread_is_answered_with_its_error(prepared_batch):
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch, steps=3)
    batch.admit(_assignment(1, "bad-group", "good"), 0.0)
    back(), back()
    assert _running(batch) == {"long": 0, "good": 0}
    assert adapter.started_on["bad-group"] == "conditioning"
    out = batch.assignments[1].outputs[0]
    assert out.status == "error" and out.error_code == "bad_request"
    done = []
    while _running(batch):
        batch.step()
        done += batch.take_done()
    [answer] = [a for a in done if a.batch_id == 1]
    assert [o.status for o in (answer.outputs[0], answer.outputs[1])] == ["error", "ok"]


def test_inline_conditioning_starts_on_the_compute_thread():
    adapter = HeldAdapter()
    batch = RunningBatch(adapter)
    batch.admit(_assignment(1, "g"), 0.0)
    assert _running(batch) == {"g": 0} and adapter.started_on == {"g": threading.current_thread().name}
    batch.step()
    batch.admit(_assignment(2, "h"), 0.0)
    assert batch.assignments[2].wire_report()["steps_while_conditioned"] == 0


def test_a_worker_conditions_inline_for_an_adapter_that_does_not_allow_a_concurrent_start():
    class Plain(HeldAdapter):
        concurrent_start = False

    def mode(adapter, **kwargs) -> str:
        worker = Worker("tcp://127.0.0.1:1", adapter, warmup_shapes=[], **kwargs)
        worker.ctx.term()
        return worker.conditioning

    assert mode(HeldAdapter()) == "thread"
    assert mode(Plain()) == "inline"
    assert mode(HeldAdapter(), conditioning="inline") == "inline"
    with pytest.raises(ValueError, match="conditioning must be one of"):
        mode(HeldAdapter(), conditioning="gpu")


# ---- admission by rows and arrival order (running.py's slot states) -----------------------------------------


def _capped(adapter, capacity: int, preparer=None) -> RunningBatch:
    return RunningBatch(adapter, capacity, preparer=preparer)


def test_a_join_beyond_the_workers_rows_waits_and_starts_at_the_first_step_with_room():
    adapter = HeldAdapter()
    batch = _capped(adapter, 2)
    batch.admit(_assignment(1, "a", steps=2), 0.0)
    batch.admit(_assignment(2, "b", steps=5), 0.0)  # two rows in use: the worker is full
    batch.admit(_assignment(3, "c", steps=2), 0.0)  # sent ahead of time: it waits here, not on the network
    assert _running(batch) == {"a": 0, "b": 0} and "c" not in adapter.started_on
    batch.step()
    batch.step()  # "a" is done: its row frees at this boundary and "c" joins at once
    assert _running(batch) == {"b": 2, "c": 0}
    assert [a.batch_id for a in batch.take_done()] == [1]


def test_nothing_overtakes_an_assignment_that_waits_for_rows():
    adapter = HeldAdapter()
    batch = _capped(adapter, 3)
    batch.admit(_assignment(1, "a", "b", steps=3), 0.0)
    batch.admit(_assignment(2, "big1", "big2", steps=3), 0.0)  # 2 rows do not fit beside 2
    batch.admit(_assignment(3, "small", steps=3), 0.0)  # 1 row would fit, but it came later
    assert _running(batch) == {"a": 0, "b": 0}
    for _ in range(3):
        batch.step()
    assert _running(batch) == {"big1": 0, "big2": 0, "small": 0}


def test_a_batch_sent_to_a_busy_worker_runs_on_its_own_after_the_running_one():
    adapter = HeldAdapter()
    batch = _capped(adapter, 8)
    batch.admit(_assignment(1, "first", steps=2), 0.0, protocol.Kind.BATCH)
    batch.admit(_assignment(2, "next", steps=2), 0.0, protocol.Kind.BATCH)  # rows to spare, but a BATCH waits
    batch.step()
    assert _running(batch) == {"first": 1}
    batch.step()
    assert _running(batch) == {"next": 0}  # started at the boundary where the first one ended


def test_a_waiting_assignment_that_is_cancelled_is_answered_without_ever_starting():
    adapter = HeldAdapter()
    batch = _capped(adapter, 1)
    batch.admit(_assignment(1, "running", steps=4), 0.0)
    batch.admit(_assignment(2, "waiting"), 0.0)
    batch.drop({2: {"waiting"}})
    [done] = batch.take_done()
    assert done.batch_id == 2 and done.outputs[0].status == "cancelled" and "waiting" not in adapter.started_on


def test_assignments_join_in_arrival_order(prepared_batch):
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch, steps=1)
    gate = adapter.hold("early")
    batch.admit(_assignment(1, "early"), 0.0)  # conditioned aside (the long group runs), held there
    batch.step()
    batch.take_done()  # the long group is done: nothing runs now
    batch.admit(_assignment(2, "late"), 0.0)  # started at once on the compute thread, ready before "early"
    assert adapter.started_on["late"] == threading.current_thread().name
    assert _running(batch) == {}  # but it does not overtake the assignment that came first
    gate.set()
    back()
    assert _running(batch) == {"early": 0, "late": 0}  # together, in order


def test_a_slot_moves_only_along_its_table():
    from candidate_scheduler.worker.running import IllegalSlotTransition, Slot, SlotState

    s = Slot(0, "g", None, SlotState.QUEUED)
    s.to(SlotState.PREPARING)
    with pytest.raises(IllegalSlotTransition):
        s.to(SlotState.RUNNING)  # not before it is ready
    s.to(SlotState.CANCELLED)
    with pytest.raises(IllegalSlotTransition):
        s.to(SlotState.READY)  # a cancelled group stays cancelled


def test_the_rows_the_scheduler_allows_now_bound_what_the_worker_admits():
    adapter = HeldAdapter()
    batch = _capped(adapter, 4)
    lowered = protocol.BatchMsg(1, _assignment(1, "a", "b", steps=2).groups, rows=2)  # it ran out of memory
    batch.arrive(arrival_from_wire(lowered, protocol.Kind.BATCH, 0.0))
    batch.arrive(arrival_from_wire(protocol.BatchMsg(2, _assignment(2, "c", steps=2).groups, rows=2),
                                   protocol.Kind.JOIN, 0.0))
    assert _running(batch) == {"a": 0, "b": 0} and batch.capacity == 2  # "c" would fit 4 rows, not 2
    batch.step()
    batch.step()
    assert _running(batch) == {"c": 0}


@contextlib.contextmanager
def _one_row_conditioned_aside():
    """A worker of one row with a conditioning thread: (adapter, batch, inbox of what it prepared)."""
    adapter = HeldAdapter()
    inbox: queue.Queue = queue.Queue()
    preparer = Preparer(adapter.start, inbox.put)
    try:
        yield adapter, _capped(adapter, 1, preparer), inbox
    finally:
        preparer.close()


def test_an_assignment_waiting_for_rows_is_conditioned_meanwhile_and_joins_as_soon_as_they_free():
    with _one_row_conditioned_aside() as (adapter, batch, inbox):
        batch.admit(_assignment(1, "running", steps=3), 0.0)
        batch.admit(_assignment(2, "next", steps=2), 0.0)  # no row for it yet: it waits on the worker
        batch.prepared(inbox.get(timeout=10))  # ... conditioned on the other thread while "running" steps
        assert adapter.started_on["next"] == "conditioning" and _running(batch) == {"running": 0}
        for _ in range(3):
            batch.step()
        assert _running(batch) == {"next": 0}  # it joins at the very boundary its row frees


def test_a_group_out_of_memory_while_conditioned_early_starts_again_once_admitted():
    """Conditioned early it holds memory beside the rows that run: running out there says nothing about
    its own rows, so it is neither answered out_of_memory (the scheduler would shrink the worker) nor
    conditioned early again."""
    adapter = HeldAdapter()
    inbox: queue.Queue = queue.Queue()
    preparer = Preparer(adapter.start, inbox.put)
    try:
        batch = _capped(adapter, 1, preparer)
        batch.admit(_assignment(1, "running", steps=3), 0.0)
        adapter.out_of_memory.add("next")
        batch.admit(_assignment(2, "next", steps=2), 0.0)
        batch.prepared(inbox.get(timeout=10))  # the early start ran out of memory
        waiting = batch.assignments[2]
        assert not waiting.complete and not waiting.early and waiting.slots[0].state is SlotState.QUEUED
        batch.step()
        assert inbox.empty()  # not conditioned early again
        batch.step(), batch.step()  # "running" is done: its row frees and "next" is admitted ...
        assert _running(batch) == {"next": 0} and adapter.started_on["next"] == threading.current_thread().name
        assert inbox.empty()  # ... and started at its own rows, on the compute thread (nothing else runs)
        done = []
        while _running(batch) or not done:
            batch.step()
            done += [a for a in batch.take_done() if a.batch_id == 2]
        assert done[0].outputs[0].status == "ok"  # not out_of_memory
    finally:
        preparer.close()


def test_a_leaving_worker_gives_back_what_waits_for_its_rows_and_keeps_what_runs():
    """`give_back`: the assignments not admitted -- one conditioned early (its group released), one still
    being conditioned (released when it comes back) -- leave; what runs stays and runs to its end."""
    with _one_row_conditioned_aside() as (adapter, batch, inbox):
        batch.admit(_assignment(1, "running", steps=3), 0.0)
        batch.admit(_assignment(2, "early", steps=2), 0.0)  # no row: conditioned early, READY
        batch.prepared(inbox.get(timeout=10))
        gate = adapter.hold("preparing")
        batch.admit(_assignment(3, "preparing", steps=2), 0.0)  # its start is held: PREPARING
        adapter.under_way("preparing")
        assert batch.assignments[2].slots[0].state is SlotState.READY
        assert batch.assignments[3].slots[0].state is SlotState.PREPARING
        assert batch.give_back() == [2, 3]
        assert list(batch.assignments) == [1] and adapter.released == ["early"]
        gate.set()
        batch.prepared(inbox.get(timeout=10))  # it comes back for an assignment given back: released
        assert adapter.released == ["early", "preparing"]
        for _ in range(3):
            batch.step()
        assert [a.batch_id for a in batch.take_done()] == [1] and batch.idle and not batch.assignments
        assert batch.give_back() == []


def test_a_give_back_keeps_what_was_admitted_beside_the_running_rows():
    adapter = HeldAdapter()
    batch = _capped(adapter, 4)
    batch.admit(_assignment(1, "a", steps=3), 0.0)
    batch.admit(_assignment(2, "b", steps=3), 0.0)  # rows to spare: admitted, running with "a"
    batch.admit(_assignment(3, "c", steps=3), 0.0, protocol.Kind.BATCH)  # a BATCH waits for the running ones
    assert batch.give_back() == [3]
    assert _running(batch) == {"a": 0, "b": 0} and "c" not in adapter.started_on


# ---- letting go: starts nobody waits for, releases that raise, everything at once -------------------------


def _after_what_queued(batch: RunningBatch, inbox: queue.Queue) -> list[Prepared]:
    """Every delivery up to a last start submitted now: the conditioning thread runs its starts in order,
    so what was queued before it has run by then, or never will."""
    sentinel = arrival_from_wire(_assignment(0, "sentinel"), protocol.Kind.JOIN, 0.0).items[0]
    batch.preparer.submit(0, 0, sentinel, token=-1)
    delivered = []
    while not delivered or delivered[-1].token != -1:
        delivered.append(inbox.get(timeout=10))
    return delivered[:-1]


def test_a_queued_start_of_an_assignment_given_back_never_runs():
    """A leaving worker's grace is not spent conditioning what runs elsewhere."""
    with _one_row_conditioned_aside() as (adapter, batch, inbox):
        batch.admit(_assignment(1, "running", steps=3), 0.0)
        gate = adapter.hold("busy")
        batch.admit(_assignment(2, "busy", steps=2), 0.0)  # the conditioning thread is busy with it ...
        adapter.under_way("busy")
        batch.admit(_assignment(3, "given-back", steps=2), 0.0)  # ... and this one queues behind it
        assert batch.give_back() == [2, 3]
        gate.set()
        for done in _after_what_queued(batch, inbox):
            batch.prepared(done)  # "busy" was under way: it comes back and is released
        assert "given-back" not in adapter.started_on and adapter.released == ["busy"]
        for _ in range(3):
            batch.step()
        assert [a.batch_id for a in batch.take_done()] == [1] and not batch.assignments


def test_a_queued_start_of_a_cancelled_group_never_runs_and_its_siblings_do_not_wait_for_it():
    with _one_row_conditioned_aside() as (adapter, batch, inbox):
        batch.admit(_assignment(1, "running", steps=3), 0.0)
        gate = adapter.hold("busy")
        batch.admit(_assignment(2, "busy", steps=2), 0.0)
        adapter.under_way("busy")
        batch.admit(_assignment(3, "kept", "cancelled", steps=2), 0.0)
        batch.drop({3: {"cancelled"}})
        gate.set()
        for done in _after_what_queued(batch, inbox):
            batch.prepared(done)
        assert "kept" in adapter.started_on and "cancelled" not in adapter.started_on
        answers = {}
        for _ in range(8):
            batch.step()
            answers.update({a.batch_id: a for a in batch.take_done()})
        assert sorted(answers) == [1, 2, 3]
        assert [answers[3].outputs[i].status for i in (0, 1)] == ["ok", "cancelled"]


def test_a_start_delivered_after_its_assignment_was_let_go_of_is_not_taken_for_a_new_one_with_its_id(prepared_batch):
    """A restarted scheduler numbers its assignments afresh: the old assignment 1's late start must not
    become the new assignment 1's group."""
    adapter, batch, back = prepared_batch
    _with_a_running_group(adapter, batch)
    gate = adapter.hold("old")
    batch.admit(_assignment(1, "old"), 0.0)
    adapter.under_way("old")
    assert [a.batch_id for a in batch.abandon()] == [99, 1] and adapter.released == ["long"]
    gate.set()  # its delivery waits in the inbox (a start on the compute thread would wait for this one)
    _with_a_running_group(adapter, batch)
    new_gate = adapter.hold("new")
    batch.admit(_assignment(1, "new"), 0.0)  # conditioned aside
    back()  # the old one's group, delivered late: released, not joined
    assert adapter.released == ["long", "old"] and _running(batch) == {"long": 0}
    assert batch.assignments[1].slots[0].state is SlotState.PREPARING
    new_gate.set()
    back()
    assert _running(batch) == {"long": 0, "new": 0}


class _ReleaseRaises(HeldAdapter):
    def release(self, group: Group) -> None:
        super().release(group)
        raise RuntimeError("a sticky device error")


class _StepRaises(_ReleaseRaises):
    def step(self, groups) -> int:
        raise RuntimeError("the forward failed")


def test_a_release_that_raises_is_logged_and_the_rest_goes_on(caplog):
    adapter = _ReleaseRaises()
    batch = RunningBatch(adapter)
    batch.admit(_assignment(1, "a", "b", steps=3), 0.0)
    batch.drop({1: {"a"}})  # cancelled: released, and the release raised
    for _ in range(3):
        batch.step()
    [done] = batch.take_done()
    assert [done.outputs[i].status for i in (0, 1)] == ["cancelled", "ok"] and adapter.released == ["a"]
    assert "releasing group a failed" in caplog.text
    failing = RunningBatch(_StepRaises())
    failing.admit(_assignment(2, "c", "d"), 0.0)
    failing.step()  # every group of the failed forward is released (each release raising) and answered
    [done] = failing.take_done()
    assert [done.outputs[i].error_code for i in (0, 1)] == ["model_error", "model_error"]
    assert failing.adapter.released == ["c", "d"] and failing.rows_admitted == 0


def test_abandoning_releases_everything_and_answers_the_unfinished_groups_worker_error():
    from candidate_scheduler.worker.running import abandoned_outputs

    adapter = _ReleaseRaises()
    batch = _capped(adapter, 1)
    batch.admit(_assignment(1, "a", "bad-group", steps=3), 0.0)  # "bad-group" failed to start: it has its answer
    batch.admit(_assignment(2, "waiting"), 0.0)  # no rows for it yet
    batch.step()
    gone = batch.abandon()
    assert [a.batch_id for a in gone] == [1, 2] and not batch.assignments and batch.rows_admitted == 0
    assert adapter.released == ["a"]
    outputs = [abandoned_outputs(a, KeyError("lost")) for a in gone]
    assert [[(o.status, o.error_code) for o in outs] for outs in outputs] == [
        [("error", "worker_error"), ("error", "bad_request")], [("error", "worker_error")]]
    batch.admit(_assignment(3, "after", steps=1), 0.0)  # it goes on with nothing
    batch.step()
    assert [a.batch_id for a in batch.take_done()] == [3]


def test_two_forwards_out_of_memory_in_a_row_are_two_incidents():
    """A failed step runs no step: numbered by the steps run, two failures in a row were one incident to
    the scheduler, which then kept the worker's rows and retried the same slice at the same size."""

    class Failing(HeldAdapter):
        def step(self, groups) -> int:
            raise stepping.OutOfMemory("CUDA out of memory (the test's)")

    adapter = Failing()
    batch = _capped(adapter, 8)
    incidents = []
    for batch_id in (1, 2):
        batch.admit(_assignment(batch_id, f"g{batch_id}"), 0.0)
        batch.step()
        (a,) = batch.take_done()
        incidents.append(a.wire_report()["oom_step"])
    assert incidents[0] != incidents[1]


def test_a_start_that_raises_system_exit_is_delivered_as_its_error_and_the_thread_goes_on():
    """A library's SystemExit in one group's start ended the conditioning thread: nothing noticed, and that
    group and every later one waited for good while the worker heartbeat them as held."""
    delivered: queue.Queue = queue.Queue()

    def start(item):
        if item == "exits":
            raise SystemExit(3)
        return f"started {item}"

    prep = Preparer(start, delivered.put)
    try:
        prep.submit(1, 0, "exits")
        prep.submit(2, 0, "next")
        first, second = delivered.get(timeout=5), delivered.get(timeout=5)
        assert isinstance(first.error, SystemExit) and first.batch_id == 1
        assert second.error is None and second.group == "started next"
    finally:
        prep.close()
