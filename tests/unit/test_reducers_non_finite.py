"""A reduction is never served non-finite, nor is a malformed fold an uncaught error."""

import numpy as np
import pytest

from candidate_scheduler.core import reducers
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.reducers import PartialReduction


@pytest.mark.parametrize("name, rows", [
    ("mean", [[1e308], [1e308]]),  # finite float64 candidates whose sum overflows
    ("median", [[1e39], [1e39]]),  # finite in float64, beyond float32's range
    ("medoid", [[1e39], [1e39]]),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_finite_candidates_that_reduce_to_inf_are_refused(name, rows):
    partial = PartialReduction(name, 2)
    partial.fold([0, 1], np.array(rows, dtype=np.float64))
    with pytest.raises(CandidateContractError) as exc:
        partial.finalize()
    assert (exc.value.field, exc.value.code) == ("reducer", "non_finite")


def test_a_model_reducer_returning_nan_is_refused():
    reducers.register_reducer("nan_test_reducer", lambda stacked: np.full(stacked.shape[1:], np.nan))
    try:
        with pytest.raises(CandidateContractError) as exc:
            reducers.reduce("nan_test_reducer", np.ones((3, 2), np.float32))
        assert exc.value.code == "non_finite"
    finally:
        reducers.unregister_reducer("nan_test_reducer")


def test_the_one_shot_reduce_refuses_a_nan_mean_as_the_fold_does():
    with pytest.raises(CandidateContractError):
        reducers.reduce("mean", [[np.nan], [1.0]])


@pytest.mark.parametrize("arrays", [None, np.array(1.0), 5])
def test_a_fold_of_no_sequence_is_a_contract_error(arrays):
    partial = PartialReduction("mean", 2)
    with pytest.raises(CandidateContractError) as exc:
        partial.fold([0, 1], arrays)
    assert exc.value.field == "arrays"
    assert partial.missing() == (0, 1)
