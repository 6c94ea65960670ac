"""The group state machine: legal transitions only, exactly-once reply, late results, retries."""

import itertools

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from candidate_scheduler.core import rng
from candidate_scheduler.core.admission import AdmissionPolicy, decide
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.group_state import (
    ALLOWED_TRANSITIONS,
    FINISHED_REASONS,
    GroupState,
    GroupStatus,
    IllegalTransition,
    WorkStatus,
    is_finished,
)
from candidate_scheduler.core.reducers import reduce
from candidate_scheduler.core.spec import CandidateTrajectorySpec, ModelCapability
from candidate_scheduler.worker import generators

CAP = ModelCapability("m", max_candidates_per_batch=4, max_candidates_per_group=64)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def actions_for(ids, horizon=3, dim=2):
    # Deterministic per-candidate actions, so any completion order yields the same candidates.
    return np.stack([np.full((horizon, dim), 0.25 * c + 1.0, dtype=np.float32) for c in ids])


def make_group(count=8, capacity=3, reducer="mean", policy=AdmissionPolicy.MICROBATCH, **kwargs):
    spec = CandidateTrajectorySpec(count=count, reducer=reducer, return_candidates=kwargs.pop("ret", False))
    clock = kwargs.pop("clock", Clock())
    g = GroupState.from_request("req-1", spec, 42, clock=clock, **kwargs)
    d = decide(spec, CAP, action_mode="policy", policy=policy, batch_capacity=capacity)
    return g, d, clock


def run_all(g, order=None, worker="w0"):
    order = range(len(g.slices)) if order is None else order
    for i in order:
        dispatch = g.start_slice(i, worker)
        assert g.complete_slice(i, worker, dispatch.candidate_ids, actions_for(dispatch.candidate_ids))


def test_ordering_and_terminal_region():
    assert list(GroupStatus) == sorted(GroupStatus)
    terminal = [s for s in GroupStatus if is_finished(s)]
    assert terminal == [GroupStatus.DONE, GroupStatus.FAILED, GroupStatus.CANCELLED, GroupStatus.EXPIRED]
    assert set(FINISHED_REASONS) == set(terminal)
    for s in terminal:
        assert ALLOWED_TRANSITIONS[s] == frozenset()


@pytest.mark.parametrize("src, dst", list(itertools.product(GroupStatus, GroupStatus)))
def test_transition_table_is_enforced(src, dst):
    g, _, _ = make_group()
    g.status = src  # place the group directly; only _transition is under test here
    if dst in ALLOWED_TRANSITIONS[src]:
        if dst is GroupStatus.DONE:
            g.partial.fold(range(8), actions_for(range(8)))
        g._transition(dst)
        assert g.status is dst
    else:
        with pytest.raises(IllegalTransition):
            g._transition(dst)
        assert g.status is src


def test_happy_path_microbatched_exactly_once():
    g, d, clock = make_group(ret=True)
    assert g.status is GroupStatus.QUEUED and g.take_reply() is None
    assert g.admit(d) and g.status is GroupStatus.ADMITTED
    assert [ids for _, ids in g.pending_slices()] == [(0, 1, 2), (3, 4, 5), (6, 7)]
    clock.t = 101.5
    run_all(g, order=[2, 0, 1])
    assert g.status is GroupStatus.REDUCING and g.pending_slices() == ()
    assert g.take_reply() is None  # nothing to answer until finished
    assert g.finish() is True
    assert g.status is GroupStatus.DONE
    reply = g.take_reply()
    assert reply is not None and g.take_reply() is None and g.reply_taken
    assert reply.status is GroupStatus.DONE and reply.reason == "done" and reply.error_code is None
    assert reply.action.tobytes() == reduce("mean", actions_for(range(8))).tobytes()
    np.testing.assert_array_equal(reply.candidates, actions_for(range(8)))
    assert reply.candidate_seeds == rng.candidate_seeds(42, 8)
    assert reply.metrics["microbatches"] == 3 and reply.metrics["slice_attempts"] == 3
    assert reply.metrics["queue_wait_s"] == pytest.approx(1.5) and reply.metrics["admission_mode"] == "microbatch"
    assert g.finish() is False and g.cancel() is False  # already answered: nothing changes
    assert g.take_reply() is None


def test_cannot_finish_or_start_out_of_order():
    g, d, _ = make_group()
    with pytest.raises(IllegalTransition):
        g.start_slice(0, "w0")  # not admitted yet
    g.admit(d)
    with pytest.raises(IllegalTransition):
        g.admit(d)
    g.start_slice(0, "w0")
    with pytest.raises(IllegalTransition):
        g.start_slice(0, "w1")  # already running
    with pytest.raises(IllegalTransition):
        g.finish()  # never a partial aggregate
    with pytest.raises(CandidateContractError):
        g.start_slice(9, "w0")


def test_late_and_duplicate_results_are_ignored():
    g, d, _ = make_group()
    g.admit(d)
    dispatch = g.start_slice(0, "w0")
    ids = dispatch.candidate_ids
    assert not g.complete_slice(0, "w1", ids, actions_for(ids))  # not its worker
    assert g.fail_slice(0, "heartbeat lost", retry_limit=3, worker_id="w0")
    assert g.slice_status(0) is WorkStatus.PENDING
    g.start_slice(0, "w1")
    assert not g.complete_slice(0, "w0", ids, actions_for(ids))  # presumed-dead worker's late result
    assert not g.fail_slice(0, "stale failure", retry_limit=3, worker_id="w0")  # stale failure ignored
    assert g.slice_status(0) is WorkStatus.RUNNING
    assert g.complete_slice(0, "w1", ids, actions_for(ids))
    assert not g.complete_slice(0, "w1", ids, actions_for(ids))  # duplicate: never double-folded
    assert g.partial.done() == ids


def retried_slice(snapshots_for):
    """A 4-candidate group in slices of 2 whose slice 1 starts on w0, fails once and starts again on
    w1; the retry carries the first attempt's candidates, seeds and snapshots. Returns (group, seeds, retry)."""
    spec = CandidateTrajectorySpec(count=4)
    seeds = spec.candidate_seeds(7)
    snaps = snapshots_for(seeds)
    g = GroupState("r", spec, seeds, snapshots=snaps, clock=Clock())
    g.admit(decide(spec, CAP, action_mode="policy", batch_capacity=2))
    first = g.start_slice(1, "w0")
    assert first.seeds == seeds[2:] and first.snapshots == tuple(snaps[2:]) and first.attempt == 1
    assert g.candidate_status[2] is WorkStatus.RUNNING
    assert g.fail_slice(1, "worker died", retry_limit=2)
    assert g.candidate_status[2] is WorkStatus.PENDING
    second = g.start_slice(1, "w1")
    assert second.attempt == 2
    assert (second.candidate_ids, second.seeds, second.snapshots) == (first.candidate_ids, first.seeds, first.snapshots)
    return g, seeds, second


def test_retry_dispatches_the_original_seeds_and_snapshots():
    # Opaque snapshot bytes: group_state never interprets them (no torch needed here).
    g, _, _ = retried_slice(lambda seeds: [None, None, b"snap-2", b"snap-3"])
    assert g.start_slice(0, "w0").snapshots == (None, None)  # None: fresh from the seed
    # Past the limit the group fails, with no partial result, and answers once.
    assert g.fail_slice(1, "worker died again", retry_limit=2)
    assert g.status is GroupStatus.FAILED
    reply = g.take_reply()
    assert reply.error_code == "retries_exhausted" and "worker died again" in reply.error_message
    assert reply.action is None and reply.candidates is None and reply.metrics["retries"] == 1
    assert g.take_reply() is None


def test_retry_restores_real_generator_snapshots():
    torch = pytest.importorskip("torch")
    g, seeds, second = retried_slice(lambda seeds: [generators.fresh_snapshot(s) for s in seeds])
    assert g.slice_attempts(1) == 2 and g.slice_worker(1) == "w1"
    # The retried snapshot is a fresh generator, not whatever the dead attempt had advanced to.
    a = torch.randn(8, generator=generators.restore(second.snapshots[0]))
    b = torch.randn(8, generator=torch.Generator().manual_seed(seeds[2]))
    assert torch.equal(a, b)


def test_completed_slices_survive_a_retry():
    g, d, _ = make_group(count=6, capacity=3)
    g.admit(d)
    run_all(g, order=[0])
    g.start_slice(1, "w0")
    g.fail_slice(1, "boom", retry_limit=5)
    assert g.partial.done() == (0, 1, 2)  # kept
    assert g.pending_slices() == ((1, (3, 4, 5)),)
    run_all(g, order=[1], worker="w1")
    g.finish()
    assert g.take_reply().action.tobytes() == reduce("mean", actions_for(range(6))).tobytes()


@pytest.mark.parametrize("stage", ["queued", "admitted", "running", "reducing", "done"])
def test_cancel_is_idempotent_and_reports_change(stage):
    g, d, _ = make_group(count=4, capacity=2)
    if stage != "queued":
        g.admit(d)
    if stage in ("running", "reducing", "done"):
        g.start_slice(0, "w0")
    if stage in ("reducing", "done"):
        g.complete_slice(0, "w0", (0, 1), actions_for((0, 1)))
        g.start_slice(1, "w0")
        g.complete_slice(1, "w0", (2, 3), actions_for((2, 3)))
    if stage == "done":
        g.finish()
    changed = g.cancel()
    assert changed is (stage != "done")
    assert g.cancel() is False
    reply = g.take_reply()
    assert reply is not None and g.take_reply() is None
    if stage == "done":
        assert reply.status is GroupStatus.DONE and reply.action is not None
    else:
        assert reply.status is GroupStatus.CANCELLED and reply.reason == "cancelled"
        assert reply.action is None and reply.candidates is None  # never a partial aggregate
        assert g.finish() is False
    if stage == "running":
        assert g.running_slices() == {0: "w0"}  # who to tell to stop
        assert not g.complete_slice(0, "w0", (0, 1), actions_for((0, 1)))  # late result after cancel


def test_expire():
    clock = Clock()
    g, d, _ = make_group(deadline=105.0, clock=clock)
    g.admit(d)
    assert g.expire(104.9) is False
    clock.t = 105.0
    assert g.expire() is True and g.status is GroupStatus.EXPIRED
    assert g.expire(200.0) is False
    reply = g.take_reply()
    assert reply.error_code == "deadline_exceeded" and reply.reason == "expired" and reply.action is None
    no_deadline, _, _ = make_group()
    assert no_deadline.expire(1e12) is False


def test_rejected_admission_fails_with_the_contract_error():
    g, d, _ = make_group(count=8, capacity=3, policy=AdmissionPolicy.REJECT)
    assert g.admit(d) is False
    assert g.status is GroupStatus.FAILED
    reply = g.take_reply()
    assert (reply.error_code, reply.error_field) == ("does_not_fit", "count")
    assert reply.metrics["admission_mode"] == "rejected"


def test_malformed_result_raises_and_changes_nothing():
    g, d, _ = make_group(count=4, capacity=2)
    g.admit(d)
    g.start_slice(0, "w0")
    with pytest.raises(CandidateContractError) as info:
        g.complete_slice(0, "w0", (0, 2), actions_for((0, 2)))
    assert info.value.code == "candidate_mismatch"
    bad = actions_for((0, 1))
    bad[1, 0, 0] = np.nan
    with pytest.raises(CandidateContractError):
        g.complete_slice(0, "w0", (0, 1), bad)
    assert g.slice_status(0) is WorkStatus.RUNNING and g.partial.done() == ()
    assert g.slices_on_worker("w0") == (0,)
    assert g.complete_slice(0, "w0", (1, 0), actions_for((1, 0)))  # any row order, matched by id
    assert g.partial.done() == (0, 1)


def test_reducer_none_returns_candidates_and_no_action():
    g, d, _ = make_group(count=3, capacity=4, reducer="none")
    g.admit(d)
    run_all(g)
    g.finish()
    reply = g.take_reply()
    assert reply.action is None and reply.candidates.shape == (3, 3, 2)


def test_medoid_reply_names_chosen_candidate():
    g, d, _ = make_group(count=5, capacity=2, reducer="medoid")
    g.admit(d)
    run_all(g, order=[2, 1, 0])
    g.finish()
    reply = g.take_reply()
    assert reply.chosen_candidate == 2  # the middle of five evenly spaced candidates
    np.testing.assert_array_equal(reply.action, actions_for([2])[0])


class GroupMachine(RuleBasedStateMachine):
    """Random interleavings of starts, results (current, late, duplicate), failures, cancels,
    expiries, finishes and reply takes. Invariants: legal statuses only, one reply, no partial data."""

    def __init__(self):
        super().__init__()
        self.clock = Clock()
        spec = CandidateTrajectorySpec(count=7, reducer="mean")
        self.g = GroupState("sm", spec, spec.candidate_seeds(1), deadline=150.0, clock=self.clock)
        self.g.admit(decide(spec, CAP, action_mode="policy", batch_capacity=3))
        self.replies = 0
        self.history = [self.g.status]

    @rule(idx=st.integers(0, 2), worker=st.sampled_from(["a", "b"]))
    def start(self, idx, worker):
        if self.g.status in (GroupStatus.ADMITTED, GroupStatus.RUNNING) and self.g.slice_status(idx) is WorkStatus.PENDING:
            d = self.g.start_slice(idx, worker)
            assert d.seeds == tuple(self.g.seeds[c] for c in d.candidate_ids)

    @rule(idx=st.integers(0, 2), worker=st.sampled_from(["a", "b"]))
    def result(self, idx, worker):
        before = self.g.partial.done()
        ids = self.g.slices[idx]
        accepted = self.g.complete_slice(idx, worker, ids, actions_for(ids))
        after = self.g.partial.done()
        assert (set(after) - set(before) == set(ids)) if accepted else (after == before)

    @rule(idx=st.integers(0, 2), limit=st.integers(0, 3))
    def fail(self, idx, limit):
        self.g.fail_slice(idx, "fault", limit)

    @rule()
    def cancel(self):
        was_finished = self.g.finished
        assert self.g.cancel() is (not was_finished)

    @rule(dt=st.floats(0, 30))
    def tick(self, dt):
        self.clock.t += dt
        self.g.expire()

    @rule()
    def finish(self):
        if self.g.status is GroupStatus.REDUCING or self.g.finished:
            self.g.finish()
        else:
            with pytest.raises(IllegalTransition):
                self.g.finish()

    @rule()
    def take(self):
        reply = self.g.take_reply()
        if reply is not None:
            self.replies += 1
            assert reply.status is self.g.status
            if reply.status is GroupStatus.DONE:
                assert reply.action.tobytes() == reduce("mean", actions_for(range(7))).tobytes()
            else:
                assert reply.action is None and reply.candidates is None

    @invariant()
    def legal(self):
        if self.g.status is not self.history[-1]:
            assert self.g.status in ALLOWED_TRANSITIONS[self.history[-1]]
            self.history.append(self.g.status)
        assert self.replies <= 1
        if self.g.status is GroupStatus.REDUCING:
            assert self.g.partial.is_complete
        if self.replies:
            assert self.g.finished


GroupMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestGroupMachine = GroupMachine.TestCase
