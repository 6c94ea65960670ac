"""Req fields the compat mapping reads: a default sent as another numeric type is still the default
(sglang compares values, not types), and a field that would change the result but cannot travel is
refused instead of dropped."""

from __future__ import annotations

import pytest

from candidate_scheduler.compat.classify import classify
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.mapping import plan_generation
from tests.unit.test_sglang_compat import load, req


@pytest.mark.parametrize("field, value", [("sound_duration", 0), ("control_guidance", 1)])
def test_a_default_given_as_an_int_is_the_default(field, value):
    # what a DiffGenerator user writes (generate(dict(..., sound_duration=0))): sglang keeps the int, and
    # treats it exactly as 0.0
    plan = plan_generation(classify(load(req(sp={field: value}))).reqs)
    assert plan.kind == "single"


@pytest.mark.parametrize("field, value", [("sound_duration", 1), ("control_guidance", 2),
                                          ("share_vision_temporal_positions", 1),
                                          ("rollout", 0)])
def test_other_values_are_still_refused(field, value):
    with pytest.raises(CompatError, match=f"{field} is not supported"):
        plan_generation(classify(load(req(sp={field: value}))).reqs)


@pytest.mark.parametrize("value", [["blurry", "blurry"], b"blurry", 3])
def test_a_negative_prompt_that_is_not_a_string_is_refused_not_dropped(value):
    with pytest.raises(CompatError, match="negative_prompt"):
        plan_generation(classify(load(req(sp={"negative_prompt": value, "guidance_scale": 3.0}))).reqs)


def test_a_string_or_absent_negative_prompt_still_travels():
    plan = plan_generation(classify(load(req(sp={"negative_prompt": "blurry", "guidance_scale": 3.0}))).reqs)
    assert plan.submit.sampling.negative_prompt == "blurry"
    plan = plan_generation(classify(load(req(sp={"negative_prompt": None}))).reqs)
    assert plan.submit.sampling.negative_prompt is None


@pytest.mark.parametrize("field", ["height", "width", "num_inference_steps", "num_frames", "fps", "domain_id",
                                   "raw_action_dim"])
def test_an_int_too_large_for_the_wire_is_a_typed_error(field):
    # it was an OverflowError from the msgpack encoder: "internal error" to the client, a traceback in the log
    with pytest.raises(CompatError, match=field):
        plan_generation(classify(load(req(sp={field: 2**70}))).reqs)


def test_a_seed_up_to_two_to_the_64_still_travels():
    plan = plan_generation(classify(load(req(sp={"seed": 2**64 - 1}))).reqs)
    assert plan.submit.seed == 2**64 - 1


def test_a_huge_int_for_a_float_default_is_refused_not_an_overflow():
    with pytest.raises(CompatError, match="sound_duration is not supported"):
        plan_generation(classify(load(req(sp={"sound_duration": 10**400}))).reqs)
