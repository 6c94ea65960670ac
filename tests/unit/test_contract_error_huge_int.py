"""A contract error about an int too long to print (over 4300 digits) is still a contract error with a
message: repr() raised ValueError inside the error's own message, and the caller got that instead."""

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec


def test_an_int_too_long_to_print_is_named_by_its_size():
    huge = 10**5000
    err = CandidateContractError("seed", "invalid_value", "out of range", huge)
    assert "bits" in str(err) and err.code == "invalid_value"


def test_a_candidate_spec_with_a_huge_negative_count_is_refused_as_a_contract_error():
    try:
        CandidateTrajectorySpec.from_dict({"count": -10**5000, "reducer": "mean"})
    except CandidateContractError as exc:  # was ValueError, from inside the error's message
        assert exc.field == "count" and "bits" in str(exc)
    else:
        raise AssertionError("a count of -10**5000 was taken")
