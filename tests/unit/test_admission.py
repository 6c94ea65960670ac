"""Admission decisions: never truncate, partition, respect capacity, bounded reasons."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core.admission import (
    ADMISSION_REASONS,
    AdmissionDecision,
    AdmissionMode,
    AdmissionPolicy,
    decide,
    split_balanced,
)
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec, ModelCapability

SETTINGS = settings(max_examples=100, deadline=None)


def capability(per_batch=8, per_group=64, reducers=("mean", "medoid"), modes=("policy",)):
    return ModelCapability(
        "m", max_candidates_per_batch=per_batch, max_candidates_per_group=per_group, reducers=reducers, action_modes=modes
    )


def test_eight_over_three_is_balanced():
    assert split_balanced(8, 3) == ((0, 1, 2), (3, 4, 5), (6, 7))
    d = decide(CandidateTrajectorySpec(count=8), capability(), action_mode="policy", batch_capacity=3)
    assert d.mode is AdmissionMode.MICROBATCH and d.reason == "over_capacity"
    assert [len(s) for s in d.slices] == [3, 3, 2]


def test_fits_is_atomic_whatever_the_policy():
    for policy in AdmissionPolicy:
        d = decide(CandidateTrajectorySpec(count=4), capability(), action_mode="policy", policy=policy, batch_capacity=4)
        assert d.mode is AdmissionMode.ATOMIC and d.slices == ((0, 1, 2, 3),) and d.reason == "fits" and d.error is None


@SETTINGS
@given(
    st.integers(1, 80),
    st.integers(1, 20),
    st.integers(1, 20),
    st.sampled_from(list(AdmissionPolicy)),
)
def test_admitted_groups_are_never_truncated(count, capacity, model_max, policy):
    cap = capability(per_batch=model_max, per_group=64)
    d = decide(CandidateTrajectorySpec(count=count), cap, action_mode="policy", policy=policy, batch_capacity=capacity)
    assert d.reason in ADMISSION_REASONS
    effective = min(capacity, model_max)
    if count > 64:
        assert d.mode is AdmissionMode.REJECTED and d.error.code == "count_over_limit" and d.error.field == "count"
        return
    if count > effective and policy is AdmissionPolicy.REJECT:
        assert d.mode is AdmissionMode.REJECTED and d.reason == "does_not_fit" and d.error.code == "does_not_fit"
        assert d.slices == ()
        return
    assert d.admitted and d.error is None
    flat = [c for s in d.slices for c in s]
    assert flat == list(range(count))  # a partition of 0..N-1, in order, nothing dropped
    assert all(1 <= len(s) <= effective for s in d.slices)
    assert all(list(s) == list(range(s[0], s[0] + len(s))) for s in d.slices)  # contiguous
    if d.mode is AdmissionMode.MICROBATCH:
        sizes = [len(s) for s in d.slices]
        assert max(sizes) - min(sizes) <= 1
        assert len(d.slices) == -(-count // effective)  # as few slices as capacity allows
    if d.mode is AdmissionMode.SEQUENTIAL:
        assert all(len(s) == 1 for s in d.slices)
    assert (d.mode is AdmissionMode.ATOMIC) == (count <= effective)


@pytest.mark.parametrize(
    "spec, mode, cap, reason, field",
    [
        (CandidateTrajectorySpec(count=2, reducer="median"), "policy", capability(), "unknown_reducer", "reducer"),
        (CandidateTrajectorySpec(count=65), "policy", capability(), "count_over_limit", "count"),
        (CandidateTrajectorySpec(count=2), "inverse_dynamics", capability(), "unsupported_action_mode", "action_mode"),
    ],
)
def test_contract_rejections(spec, mode, cap, reason, field):
    d = decide(spec, cap, action_mode=mode)
    assert d.mode is AdmissionMode.REJECTED and not d.admitted
    assert d.reason == reason and d.error.code == reason and d.error.field == field
    assert d.slices == ()
    assert field in str(d.error)


def test_none_reducer_is_always_supported():
    d = decide(CandidateTrajectorySpec(count=2, reducer="none"), capability(reducers=()), action_mode="policy")
    assert d.mode is AdmissionMode.ATOMIC


def test_bad_capacity_raises():
    with pytest.raises(CandidateContractError) as info:
        decide(CandidateTrajectorySpec(), capability(), action_mode="policy", batch_capacity=0)
    assert info.value.field == "batch_capacity"


def test_decision_invariants():
    with pytest.raises(AssertionError):
        AdmissionDecision(AdmissionMode.ATOMIC, (), "fits")  # admitted without work
    with pytest.raises(AssertionError):
        AdmissionDecision(AdmissionMode.ATOMIC, ((0,),), "because")  # unbounded reason
    with pytest.raises(AssertionError):
        AdmissionDecision(AdmissionMode.REJECTED, (), "does_not_fit")  # rejected without an error
