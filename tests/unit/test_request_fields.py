"""validate() answers every malformed field of a submission with a CandidateContractError naming it (or a
ValueError about the request's shape), never another exception, and never takes a nonsense value."""

import numpy as np
import pytest

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.request import Submission, validate

IMAGE = np.zeros((16, 16, 3), np.uint8)


def _sub(**kw):
    return Submission(**{"request_id": "r", "images": IMAGE, **kw})


@pytest.mark.parametrize("kw, field", [
    ({"candidates": {"cout": 3}}, "candidates.cout"),  # a misspelt key
    ({"candidates": {"count": 3, 7: 1}}, "candidates.7"),  # a key that is no string
    ({"candidates": [("count", 3)]}, "candidates"),
    ({"sampling": {"stpes": 4}}, "sampling.stpes"),
    ({"sampling": {"steps": 4, "return_step_indices": [0], "bogus": 1}}, "sampling.bogus"),  # uncached path
    ({"candidates": {"count": 1, "seeds": {7: 1}}}, "seeds"),  # a map is no list of seeds (was: its keys)
    ({"deadline_s": True}, "deadline_s"),
    ({"seed": -1, "candidates": {"seeds": [1]}}, "seed"),  # unused under explicit seeds, still a bad seed
    ({"seed": 2**64, "candidates": {"seed_policy": "explicit", "seeds": [1]}}, "seed"),
    ({"seed": True}, "seed"),
    ({"seed": 1.5, "candidates": {"seeds": [1]}}, "seed"),
    ({"batched": "no", "images": IMAGE[None]}, "batched"),  # was taken as True
    ({"batched": 1, "images": IMAGE[None]}, "batched"),
])
def test_a_bad_field_is_named(kw, field):
    with pytest.raises(CandidateContractError) as exc:
        validate(_sub(**kw))
    assert exc.value.field == field


@pytest.mark.parametrize("kw", [{"prompt": None}, {"prompt": 5}, {"initial_noise": [[[0.0] * 7] * 16]}])
def test_a_bad_shape_is_a_value_error(kw):
    with pytest.raises(ValueError):
        validate(_sub(**kw))


def test_seeds_near_the_limit_are_taken():
    req = validate(_sub(seed=2**64 - 1, candidates={"count": 2, "seeds": [2**64 - 1, 0]}))
    assert req.seed == 2**64 - 1 and req.spec.seeds == (2**64 - 1, 0)
