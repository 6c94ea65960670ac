"""Spec, group and capability validation; capability wire round-trip."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core import rng
from candidate_scheduler.core.errors import ERROR_CODES, CandidateContractError
from candidate_scheduler.core.spec import (
    CandidateTrajectorySpec,
    EquivalenceRule,
    ModelCapability,
    SeedPolicy,
)

SETTINGS = settings(max_examples=60, deadline=None)


def test_defaults():
    spec = CandidateTrajectorySpec()
    assert (spec.count, spec.reducer, spec.return_candidates) == (1, "mean", False)
    assert spec.seed_policy is SeedPolicy.PER_CANDIDATE and spec.seeds is None
    assert spec.candidate_seeds(42) == (42,)


@pytest.mark.parametrize(
    "kwargs, field, code, shown",
    [
        (dict(count=0), "count", "invalid_count", "0"),
        (dict(count=-3), "count", "invalid_count", "-3"),
        (dict(count=True), "count", "invalid_type", "True"),
        (dict(count=2.0), "count", "invalid_type", "2.0"),
        (dict(reducer="vote"), "reducer", "unknown_reducer", "'vote'"),
        (dict(return_candidates=1), "return_candidates", "invalid_type", "1"),
        (dict(seed_policy="random"), "seed_policy", "seed_policy", "'random'"),
        (dict(count=3, seeds=(1, 2)), "seeds", "seeds_length", "2"),
        (dict(count=2, seeds=(1, -2)), "seeds[1]", "invalid_seed", "-2"),
        (dict(count=2, seeds=(1, 2**64)), "seeds[1]", "invalid_seed", str(2**64)),
        (dict(count=1, seed_policy="explicit"), "seeds", "seed_policy", "None"),
        (dict(count=2, seed_policy="offset", seeds=(1, 2)), "seeds", "seed_policy", "'offset'"),
        (dict(count=2, seeds="12"), "seeds", "invalid_type", "'12'"),
    ],
)
def test_spec_errors_name_the_field_and_value(kwargs, field, code, shown):
    with pytest.raises(CandidateContractError) as info:
        CandidateTrajectorySpec(**kwargs)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.field, err.code) == (field, code)
    assert field in str(err) and shown in str(err)
    assert err.code in ERROR_CODES


def test_seeds_with_default_policy_become_explicit():
    spec = CandidateTrajectorySpec(count=3, seeds=[5, 6, 7])
    assert spec.seed_policy is SeedPolicy.EXPLICIT
    assert spec.seeds == (5, 6, 7)  # normalised to a tuple: the spec stays hashable
    assert spec.candidate_seeds(999) == (5, 6, 7)
    hash(spec)


def test_reducer_none_is_allowed():
    assert CandidateTrajectorySpec(count=4, reducer="none").reducer == "none"


@SETTINGS
@given(
    st.integers(min_value=1, max_value=64),
    st.sampled_from(["none", "mean", "median", "medoid"]),
    st.booleans(),
    st.sampled_from(list(SeedPolicy)),
    st.integers(min_value=0, max_value=2**32),
    st.data(),
)
def test_spec_round_trip_and_seeds(count, reducer, ret, policy, base, data):
    seeds = None
    if policy is SeedPolicy.EXPLICIT:
        seeds = tuple(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=count, max_size=count)))
    spec = CandidateTrajectorySpec(count, reducer, ret, policy.value, seeds)
    assert CandidateTrajectorySpec.from_dict(spec.to_dict()) == spec
    got = spec.candidate_seeds(base)
    assert got == rng.candidate_seeds(base, count, policy, seeds)
    assert len(got) == count
    if policy is not SeedPolicy.EXPLICIT:
        assert got[0] == base


def test_spec_from_dict_refuses_unknown_keys():
    with pytest.raises(CandidateContractError) as info:
        CandidateTrajectorySpec.from_dict({"count": 2, "reducr": "mean"})
    assert info.value.field == "reducr" and info.value.code == "unknown_field"


@pytest.mark.parametrize("count, min_count", [(4, 0), (4, 5), (1, -1)])
def test_min_count_must_lie_in_1_to_count(count, min_count):
    with pytest.raises(CandidateContractError) as info:
        CandidateTrajectorySpec(count=count, min_count=min_count)
    assert info.value.field == "min_count" and info.value.code == "invalid_count"


def test_min_count_defaults_to_count_and_round_trips():
    assert CandidateTrajectorySpec(count=6).min_count == 6
    spec = CandidateTrajectorySpec(count=6, min_count=2)
    assert CandidateTrajectorySpec.from_dict(spec.to_dict()) == spec


# --- capability ----------------------------------------------------------------------------------

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
capabilities = st.builds(
    ModelCapability,
    model_name=names,
    action_tensor=names,
    action_shape=st.lists(st.one_of(st.none(), st.integers(1, 128)), max_size=3).map(tuple),
    action_dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64"]),
    reduce_after_denormalize=st.booleans(),
    reducers=st.lists(names, unique=True, max_size=4).map(tuple),
    action_modes=st.lists(names, unique=True, min_size=1, max_size=3).map(tuple),
    candidate_invariant=st.lists(names, unique=True, max_size=4).map(tuple),
    auxiliary_branch_required=st.booleans(),
    max_candidates_per_batch=st.integers(1, 1024),
    max_candidates_per_group=st.integers(1, 1024),
    equivalence=st.builds(
        EquivalenceRule,
        dtype=st.sampled_from(["bfloat16", "float32"]),
        atol=st.floats(0, 1, allow_nan=False),
        rtol=st.floats(0, 1, allow_nan=False),
        bitwise_on_cpu=st.booleans(),
    ),
)


@SETTINGS
@given(capabilities)
def test_capability_round_trip_exact(cap):
    wire = cap.to_dict()
    assert ModelCapability.from_dict(wire) == cap
    assert ModelCapability.from_dict(wire).to_dict() == wire
    # The wire form is msgpack-friendly: only maps, lists, str, int, float, bool and None.
    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, list):
            return all(plain(v) for v in x)
        return x is None or isinstance(x, (str, int, float, bool))
    assert plain(wire)


def cosmos_like(**overrides):
    kwargs = dict(
        model_name="cosmos3-tiny",
        action_tensor="action_latents",
        action_shape=(None, 7),
        action_dtype="float32",
        reduce_after_denormalize=True,
        reducers=("mean", "median", "medoid"),
        action_modes=("policy",),
        candidate_invariant=("text_kv", "image_latent", "timesteps"),
        auxiliary_branch_required=True,
        max_candidates_per_batch=8,
        max_candidates_per_group=32,
        equivalence=EquivalenceRule("bfloat16", 1e-2, 1e-2, True),
    )
    kwargs.update(overrides)
    return ModelCapability(**kwargs)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(model_name=""), "model_name"),
        (dict(action_shape=(16, 0)), "action_shape[1]"),
        (dict(action_shape="16"), "action_shape"),
        (dict(action_dtype="int8"), "action_dtype"),
        (dict(action_modes=()), "action_modes"),
        (dict(reducers=("mean", "mean")), "reducers"),
        (dict(max_candidates_per_batch=0), "max_candidates_per_batch"),
        (dict(max_candidates_per_group=1.5), "max_candidates_per_group"),
        (dict(auxiliary_branch_required="yes"), "auxiliary_branch_required"),
        (dict(equivalence={"dtype": "float32"}), "equivalence"),
    ],
)
def test_capability_validation_names_field(overrides, field):
    with pytest.raises(CandidateContractError) as info:
        cosmos_like(**overrides)
    assert info.value.field == field


def test_capability_from_dict_errors():
    wire = cosmos_like().to_dict()
    with pytest.raises(CandidateContractError) as info:
        ModelCapability.from_dict({**wire, "extra": 1})
    assert info.value.field == "extra"
    del wire["model_name"]
    with pytest.raises(CandidateContractError) as info:
        ModelCapability.from_dict(wire)
    assert info.value.field == "model_name"
    with pytest.raises(CandidateContractError) as info:
        EquivalenceRule.from_dict({"atol": -1.0})
    assert info.value.field == "equivalence.atol"


def test_equivalence_close():
    rule = EquivalenceRule("float32", atol=1e-3, rtol=0.0, bitwise_on_cpu=True)
    a = np.zeros((4, 7), dtype=np.float32)
    assert rule.close(a, a + 5e-4)
    assert not rule.close(a, a + 5e-3)
    assert not rule.close(a, a + 5e-4, cpu=True)  # bitwise promised on CPU
    assert rule.close(a, a.copy(), cpu=True)
    assert not rule.close(a, a[:1])  # no broadcasting
    nan = a.copy()
    nan[0, 0] = np.nan
    assert not rule.close(nan, nan)
    assert EquivalenceRule(atol=1.0, bitwise_on_cpu=False).close(a, a + 0.5, cpu=True)


def test_error_pickles_with_field_and_code():
    err = CandidateContractError("count", "invalid_count", "must be >= 1", 0)
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.code, str(back)) == ("count", "invalid_count", str(err))
    assert back.to_dict() == {"code": "invalid_count", "field": "count", "message": "count: must be >= 1 (got 0)"}
    with pytest.raises(AssertionError):
        CandidateContractError("count", "no_such_code", "x")


def test_a_sampling_spec_seen_before_is_not_taken_for_one_that_only_compares_equal():
    from candidate_scheduler.core.request import Submission, validate

    image = np.zeros((16, 16, 3), np.uint8)
    ok = validate(Submission("a", image, "p", {"count": 1}, 1, {"steps": 4}))
    assert ok.sampling.steps == 4
    with pytest.raises(ValueError, match="steps must be an int"):
        validate(Submission("b", image, "p", {"count": 1}, 1, {"steps": 4.0}))  # 4.0 == 4, but not valid
    with pytest.raises(ValueError, match="rollout must be a bool"):
        validate(Submission("c", image, "p", {"count": 1}, 1, {"rollout": 1}))
    seen = {"steps": 4, "rollout": True, "return_step_indices": (0, 1)}
    assert validate(Submission("d", image, "p", {"count": 1, "reducer": "none"}, 1, seen)).sampling.rollout
    for bad in ((False, 1), (0.0, 1.0)):  # compare equal to (0, 1), inside a tuple
        with pytest.raises(ValueError, match="return_step_indices"):
            validate(Submission("e", image, "p", {"count": 1, "reducer": "none"}, 1, {**seen, "return_step_indices": bad}))


def test_a_candidate_spec_seen_before_is_not_taken_for_one_that_only_compares_equal():
    from candidate_scheduler.core.request import Submission, validate

    image = np.zeros((16, 16, 3), np.uint8)
    first = validate(Submission("a", image, "p", {"count": 2, "min_count": 1}, 1, None)).spec
    assert validate(Submission("b", image, "p", {"count": 2, "min_count": 1}, 1, None)).spec is first  # checked once
    for bad, field in (({"count": 2.0, "min_count": 1}, "count"), ({"count": 2, "min_count": True}, "min_count"),
                       ({"count": 2, "return_candidates": 1}, "return_candidates")):
        with pytest.raises(CandidateContractError) as err:
            validate(Submission("c", image, "p", bad, 1, None))
        assert err.value.field == field
    seeds = validate(Submission("d", image, "p", {"count": 2, "seeds": [5, 6]}, 1, None)).spec  # a list: not cached
    assert seeds.seeds == (5, 6) and seeds.candidate_seeds(1) == (5, 6)
    with pytest.raises(CandidateContractError, match="seeds"):
        validate(Submission("e", image, "p", {"count": 2, "seeds": [5, True]}, 1, None))


def test_a_negative_prompt_is_a_string_no_longer_than_a_prompt():
    from candidate_scheduler.core.work import MAX_PROMPT_CHARS, SamplingSpec

    assert SamplingSpec(negative_prompt="x" * MAX_PROMPT_CHARS).negative_prompt
    with pytest.raises(ValueError, match="negative_prompt must be a string of at most 4096"):
        SamplingSpec(negative_prompt="x" * (MAX_PROMPT_CHARS + 1))
    with pytest.raises(ValueError, match="negative_prompt"):
        SamplingSpec(negative_prompt=3)
