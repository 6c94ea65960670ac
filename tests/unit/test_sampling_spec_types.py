"""A group's sampling fields refuse bools: Python counts True as the int 1, so `steps=True` ran one
denoise step, `fps=True` one frame a second and `guidance_scale=True` a scale of 1.0 (from the Python
API, or anything that builds a SamplingSpec from decoded JSON or msgpack without msgspec's types)."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.work import SamplingSpec


@pytest.mark.parametrize("field", ["height", "width", "steps", "horizon", "guidance_scale", "domain_id",
                                   "raw_action_dim", "fps", "noise_level"])
@pytest.mark.parametrize("flag", [True, False])
def test_a_bool_is_not_a_number_of_the_sampling(field, flag):
    with pytest.raises(ValueError, match=field):
        SamplingSpec(**{field: flag})


def test_a_bool_is_not_a_step_index():
    with pytest.raises(ValueError, match="return_step_indices"):
        SamplingSpec(steps=4, rollout=True, return_step_indices=(True, 2))


def test_the_numbers_themselves_still_pass():
    s = SamplingSpec(height=64, width=64, steps=1, horizon=4, guidance_scale=1, domain_id=0, raw_action_dim=1, fps=1,
                     noise_level=1, rollout=True, return_step_indices=(0,))
    assert (s.steps, s.fps, s.guidance_scale, s.raw_action_dim) == (1, 1, 1, 1)
