"""Reducer registry, streaming folds and split invariance."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core import reducers
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.reducers import PartialReduction, reduce

SETTINGS = settings(max_examples=60, deadline=None)
REDUCING = ["mean", "median", "medoid"]


@st.composite
def grouped_candidates(draw):
    """Random candidates [N, H, D] (float32), a random split into contiguous-or-not slices, and a
    random order in which the slices arrive."""
    n = draw(st.integers(1, 12))
    h = draw(st.integers(1, 5))
    d = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    arr = np.random.default_rng(seed).standard_normal((n, h, d)).astype(np.float32)
    arr *= draw(st.sampled_from([1e-3, 1.0, 1e3]))
    perm = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    slices = [list(perm[a:b]) for a, b in zip(bounds, bounds[1:]) if a < b]
    order = draw(st.permutations(range(len(slices))))
    return arr, slices, order


@SETTINGS
@given(grouped_candidates(), st.sampled_from(REDUCING + ["none"]))
def test_streaming_is_bit_identical_to_one_shot_however_split(case, name):
    arr, slices, order = case
    partial = PartialReduction(name, len(arr))
    for k in order:
        ids = slices[k]
        # Alternate between ndarray and list payloads: both are accepted.
        payload = arr[ids] if k % 2 else [arr[i] for i in ids]
        partial.fold(ids, payload)
    streamed = partial.finalize()
    one_shot = reduce(name, arr)
    if name == "none":
        assert streamed is None and one_shot is None
    else:
        assert streamed.dtype == np.float32 and streamed.shape == arr.shape[1:]
        assert streamed.tobytes() == one_shot.tobytes()
    assert np.array_equal(partial.candidates(), arr)  # raw candidates come back in id order


@SETTINGS
@given(grouped_candidates())
def test_mean_and_median_values(case):
    arr = case[0]
    np.testing.assert_allclose(reduce("mean", arr), arr.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(reduce("median", arr), np.median(arr.astype(np.float64), axis=0).astype(np.float32))


def _mean_from_zeros(arr: np.ndarray) -> np.ndarray:
    """The mean as first written: a float64 row of zeros, each row added in id order, divided by N."""
    acc = np.zeros(arr.shape[1:], dtype=np.float64)
    for row in arr.astype(np.float64):
        acc += row
    return (acc / arr.shape[0]).astype(np.float32)


@SETTINGS
@given(grouped_candidates(), st.sampled_from([0.0, -0.0]))
def test_mean_is_bitwise_the_sum_from_zeros(case, zero):
    # The mean starts from its first row rather than from zeros; every bit must stay as it was, signed
    # zeros included (0.0 + -0.0 is +0.0, so a sum from zeros never yields -0.0).
    arr = case[0].copy()
    arr[0, 0, 0] = zero
    arr[:, -1, -1] = zero  # a whole column of one zero's sign
    assert reduce("mean", arr).tobytes() == _mean_from_zeros(arr).tobytes()


def test_mean_accumulates_in_float64():
    # In float32, 1e8 + 1 + 1 - 1e8 loses the ones; computed in float64 the mean is exactly 0.5.
    arr = np.array([[1e8], [1.0], [1.0], [-1e8]], dtype=np.float32)
    assert reduce("mean", arr)[0] == np.float32(0.5)
    assert reducers.get_reducer("mean")(arr)[0] == 0.5  # also when called on float32 rows directly


@SETTINGS
@given(grouped_candidates())
def test_medoid_returns_a_real_candidate(case):
    arr, slices, order = case
    partial = PartialReduction("medoid", len(arr))
    for k in order:
        partial.fold(slices[k], arr[slices[k]])
    action = partial.finalize()
    chosen = partial.chosen_candidate
    assert chosen is not None and 0 <= chosen < len(arr)
    assert action.tobytes() == arr[chosen].tobytes()
    flat = arr.reshape(len(arr), -1).astype(np.float64)
    totals = [np.linalg.norm(flat - flat[i], axis=1).sum() for i in range(len(arr))]
    assert totals[chosen] <= min(totals) * (1 + 1e-12) + 1e-12


def test_medoid_is_not_the_mean_of_two_modes():
    # Two modes (left / right); the mean would be the middle that nobody proposed.
    arr = np.array([[[-1.0]], [[-1.0]], [[1.0]], [[1.0]], [[0.9]]], dtype=np.float32)
    action = reduce("medoid", arr)
    assert action[0, 0] in (-1.0, 1.0, np.float32(0.9))
    assert reducers.reduce_full("medoid", arr).chosen_candidate in range(5)
    assert abs(reduce("mean", arr)[0, 0]) < 0.5


def test_medoid_ties_go_to_lowest_id():
    arr = np.array([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]], dtype=np.float32)
    assert reducers.reduce_full("medoid", arr).chosen_candidate == 0
    assert reducers.reduce_full("medoid", arr[::-1].copy()).chosen_candidate == 0


def test_finalize_refuses_partial_group():
    partial = PartialReduction("mean", 4)
    partial.fold([2, 0], np.ones((2, 3), dtype=np.float32))
    assert not partial.is_complete and partial.missing() == (1, 3) and partial.done() == (0, 2)
    with pytest.raises(CandidateContractError) as info:
        partial.finalize()
    assert info.value.code == "incomplete_group" and "(1, 3)" in str(info.value)
    with pytest.raises(CandidateContractError):
        partial.candidates()
    partial.fold([3, 1], np.zeros((2, 3), dtype=np.float32))
    assert partial.is_complete
    np.testing.assert_array_equal(partial.finalize(), np.full(3, 0.5, dtype=np.float32))


F32 = np.float32


@pytest.mark.parametrize(
    "ids, arrays, code",
    [
        ([0, 0], np.zeros((2, 3), F32), "duplicate_candidate"),
        ([1], np.zeros((1, 3), F32), "duplicate_candidate"),  # 1 was folded in the setup
        ([5], np.zeros((1, 3), F32), "unknown_candidate"),
        ([-1], np.zeros((1, 3), F32), "unknown_candidate"),
        ([0, 2], np.zeros((1, 3), F32), "shape_mismatch"),
        ([0], np.zeros((1, 4), F32), "shape_mismatch"),
        ([0], np.zeros((1, 3), np.float16), "shape_mismatch"),  # dtype differs from the first fold
        ([0], np.zeros((1, 3), bool), "invalid_type"),
        ([0], np.full((1, 3), np.nan, F32), "non_finite"),
        ([0, 2], [np.zeros(3, F32), np.full(3, np.inf, F32)], "non_finite"),
    ],
)
def test_fold_refuses_bad_input_atomically(ids, arrays, code):
    partial = PartialReduction("mean", 4)
    partial.fold([1], np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(CandidateContractError) as info:
        partial.fold(ids, arrays)
    assert info.value.code == code
    assert partial.done() == (1,)  # nothing from the bad call was recorded


def test_fold_copies_caller_buffers():
    partial = PartialReduction("mean", 1)
    buf = np.ones((1, 2), dtype=np.float32)
    partial.fold([0], buf)
    buf[:] = 7
    np.testing.assert_array_equal(partial.finalize(), np.ones(2, dtype=np.float32))
    several = PartialReduction("mean", 3)
    buf = np.ones((3, 2), dtype=np.float32)
    several.fold([0, 1, 2], buf)  # one array: checked and copied at once
    buf[:] = 7
    np.testing.assert_array_equal(several.finalize(), np.ones(2, dtype=np.float32))


def _faulty(rows: int, faults: dict[int, str]) -> tuple[list, np.ndarray]:
    ids, arr = list(range(rows)), np.random.default_rng(rows).standard_normal((rows, 2, 3)).astype(F32)
    for row, fault in faults.items():
        if fault == "nan":
            arr[row, 1, 2] = np.nan
        elif fault == "inf":
            arr[row, 0, 0] = -np.inf
        elif fault == "bad_id":
            ids[row] = rows + 5
        elif fault == "dup_id":
            ids[row] = ids[0]
    return ids, arr


@pytest.mark.parametrize("faults", [
    {}, {3: "nan"}, {0: "inf"}, {2: "bad_id", 5: "nan"}, {1: "nan", 4: "bad_id"}, {6: "dup_id", 2: "inf"},
    {1: "dup_id"}, {7: "nan", 0: "nan"},
])
def test_fold_of_one_array_is_the_fold_of_its_rows(faults):
    """A slice folded as one array (checked at once) and as a list of its rows (checked one by one):
    the same result, bit for bit, or the same error naming the same candidate."""
    ids, arr = _faulty(8, faults)
    outcomes = []
    for arrays in (arr, list(arr)):
        partial = PartialReduction("mean", 8)
        try:
            partial.fold(ids, arrays)
            outcomes.append(("ok", partial.finalize().tobytes()))
        except CandidateContractError as exc:
            outcomes.append((exc.code, exc.field, str(exc)))
            assert partial.done() == ()
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0][0] == "ok") == (not faults)


def test_registry_api():
    assert set(reducers.BUILTIN_REDUCERS) <= set(reducers.registered_reducers())
    assert reducers.is_registered("medoid") and not reducers.is_registered("vote")
    with pytest.raises(CandidateContractError) as info:
        reducers.get_reducer("vote")
    assert info.value.code == "unknown_reducer" and "'vote'" in str(info.value)
    with pytest.raises(CandidateContractError):
        reducers.register_reducer("mean", lambda s: s[0])
    with pytest.raises(CandidateContractError):
        reducers.register_reducer("Bad-Name", lambda s: s[0])

    class First:
        def __call__(self, stacked):
            return stacked[0]

    try:
        reducers.register_reducer("first_test", First)
        with pytest.raises(CandidateContractError) as info:
            reducers.register_reducer("first_test", lambda s: s[-1])
        assert info.value.code == "reducer_exists"
        arr = np.arange(6, dtype=np.float32).reshape(3, 2)
        np.testing.assert_array_equal(reduce("first_test", arr), arr[0])
        reducers.register_reducer("first_test", lambda s: s[-1], overwrite=True)
        np.testing.assert_array_equal(reduce("first_test", arr), arr[-1])
        reducers.register_reducer("broken_test", lambda s: s)  # wrong output shape
        with pytest.raises(CandidateContractError) as info:
            reduce("broken_test", arr)
        assert info.value.code == "bad_reducer_output"
    finally:
        assert reducers.unregister_reducer("first_test")
        reducers.unregister_reducer("broken_test")
    assert not reducers.is_registered("first_test")
    assert not reducers.unregister_reducer("first_test")


def test_a_reducer_name_with_a_trailing_newline_is_refused():
    """`$` in re.match also matches before a final newline: "custom\\n" was registered, a name no
    request can spell and a metric label with a line break in it."""
    from candidate_scheduler.core.errors import CandidateContractError
    from candidate_scheduler.core.reducers import register_reducer
    with pytest.raises(CandidateContractError):
        register_reducer("custom\n", lambda stacked: stacked.mean(axis=0))
