"""Folding a group's slices: which results a slice takes, the elastic count's checks, and that a group
folded slice by slice, in any order and after retries, serves the one-shot reduction of its candidates."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core.admission import AdmissionDecision, AdmissionMode
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.group_state import GroupState, GroupStatus, IllegalTransition, WorkStatus
from candidate_scheduler.core.reducers import reduce_full
from candidate_scheduler.core.spec import CandidateTrajectorySpec


def _group(count, slices, **spec):
    g = GroupState("g", CandidateTrajectorySpec(count=count, **spec), list(range(count)), clock=lambda: 0.0)
    mode = AdmissionMode.ATOMIC if len(slices) == 1 else AdmissionMode.MICROBATCH
    assert g.admit(AdmissionDecision(mode, tuple(map(tuple, slices)), "fits"))
    return g


def _rows(ids):
    return np.array([[1.0 + c, -2.0 * c] for c in ids], dtype=np.float32)


def test_a_slice_admitted_out_of_order_takes_its_own_result():
    g = _group(3, [(2, 0), (1,)])
    d = g.start_slice(0, "w")
    assert g.complete_slice(0, "w", d.candidate_ids, _rows(d.candidate_ids))
    assert g.slice_status(0) is WorkStatus.DONE


@pytest.mark.parametrize("ids", [[0.9, 1.5], [False, True], [None, 1], ["0", "1"]])
def test_candidate_ids_that_are_not_ints_are_refused_unfolded(ids):
    g = _group(2, [(0, 1)])
    g.start_slice(0, "w")
    with pytest.raises(CandidateContractError) as exc:
        g.complete_slice(0, "w", ids, _rows([0, 1]))
    assert exc.value.field == "candidate_ids"
    assert g.partial.missing() == (0, 1) and g.slice_status(0) is WorkStatus.RUNNING


@pytest.mark.parametrize("n", [True, 1.0, 2.5, "2"])
def test_serve_first_refuses_a_count_that_is_no_int_and_changes_nothing(n):
    g = _group(3, [(0, 1, 2)], min_count=1)
    with pytest.raises(CandidateContractError):
        g.serve_first(n, AdmissionDecision(AdmissionMode.ATOMIC, ((0,),), "fits"))
    assert (g.served_count, len(g.seeds), g.partial.count, g.slices) == (3, 3, 3, ((0, 1, 2),))
    d = g.start_slice(0, "w")  # the group still runs whole
    assert g.complete_slice(0, "w", d.candidate_ids, _rows(d.candidate_ids))


def test_an_ended_group_keeps_its_slices():
    g = _group(4, [(0, 1, 2, 3)])
    g.cancel()
    with pytest.raises(IllegalTransition):
        g.split_slice(0)
    assert g.slices == ((0, 1, 2, 3),)


@st.composite
def _runs(draw):
    count = draw(st.integers(1, 10))
    n = draw(st.integers(1, count))  # served under an elastic count
    perm = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    slices = [tuple(perm[a:b]) for a, b in zip(bounds, bounds[1:]) if a < b]
    order = draw(st.permutations(range(len(slices))))
    retried = draw(st.sets(st.sampled_from(range(len(slices)))))
    seed = draw(st.integers(0, 2**32 - 1))
    return count, n, slices, order, retried, seed


@settings(max_examples=80, deadline=None)
@given(_runs(), st.sampled_from(["mean", "median", "medoid", "none"]))
def test_folded_any_way_the_reply_is_the_one_shot_reduction_of_the_served(run, reducer):
    count, n, slices, order, retried, seed = run
    cands = np.random.default_rng(seed).standard_normal((count, 3, 2)).astype(np.float32)
    g = GroupState("g", CandidateTrajectorySpec(count=count, reducer=reducer, min_count=1, return_candidates=True),
                   list(range(count)), clock=lambda: 0.0)
    assert g.admit(AdmissionDecision(AdmissionMode.ATOMIC, (tuple(range(count)),), "fits"))
    mode = AdmissionMode.ATOMIC if len(slices) == 1 else AdmissionMode.MICROBATCH
    g.serve_first(n, AdmissionDecision(mode, tuple(slices), "fits"))
    for k in order:
        if k in retried:  # a first attempt that failed, then a late result from it
            g.start_slice(k, "a")
            assert g.fail_slice(k, "lost", retry_limit=2)
            assert not g.complete_slice(k, "a", slices[k], cands[list(slices[k])] + 1.0)
        d = g.start_slice(k, "b")
        assert g.complete_slice(k, "b", d.candidate_ids, cands[list(d.candidate_ids)])
        assert not g.complete_slice(k, "b", d.candidate_ids, cands[list(d.candidate_ids)])  # folded once
    assert g.status is GroupStatus.REDUCING and g.finish()
    reply = g.take_reply()
    whole = reduce_full(reducer, cands[:n])
    assert reply.status is GroupStatus.DONE and reply.candidate_seeds == tuple(range(n))
    np.testing.assert_array_equal(reply.candidates, cands[:n])
    if whole.action is None:
        assert reply.action is None
    else:
        assert reply.action.dtype == np.float32 and reply.action.tobytes() == whole.action.tobytes()
    assert reply.chosen_candidate == whole.chosen_candidate
