"""A number too large to print or to make a float is the client's error, said as such.

Pickle carries ints of any size (LONG4). The mapping's messages formatted the bad value with str(), and
Python refuses str() of an int over 4300 digits (ValueError); guidance_scale went through math.isfinite,
which raises OverflowError for an int past the float range. Either escaped `plan_generation` as a plain
exception: the bridge answered "internal error" and logged a traceback for every such request."""

from __future__ import annotations

import pytest

from candidate_scheduler.compat.classify import classify
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.mapping import plan_generation
from tests.unit.test_sglang_compat import load, req

HUGE = 10**5000  # past sys.get_int_max_str_digits() (4300), and past the float range


@pytest.mark.parametrize("field, value", [
    ("seed", HUGE), ("seed", -HUGE), ("height", -HUGE), ("num_inference_steps", HUGE),
    ("fps", -HUGE), ("domain_id", HUGE), ("guidance_scale", HUGE), ("guidance_scale", -HUGE),
], ids=lambda v: v if isinstance(v, str) else ("+huge" if v > 0 else "-huge"))
def test_huge_ints_are_refused_as_the_clients_error(field, value):
    with pytest.raises(CompatError, match=field):
        plan_generation(classify(load(req(sp={field: value}))).reqs)


def test_ordinary_out_of_range_values_still_name_the_value():
    with pytest.raises(CompatError, match="got -3"):
        plan_generation(classify(load(req(sp={"height": -3}))).reqs)
    with pytest.raises(CompatError, match="seed"):
        plan_generation(classify(load(req(sp={"seed": 2**64}))).reqs)


@pytest.mark.parametrize("over", [
    {"sp": {"action_mode": HUGE}},
    {"sp": {"action_mode": [HUGE]}},
    {"extra": {"candidates": HUGE}},
    {"extra": {"candidates": -HUGE}},
    {"extra": {"candidates": {"count": 2, "seeds": [HUGE, 1]}}},
    {"extra": {"candidates": {"count": 2, "reducer": HUGE}}},
], ids=["action_mode", "action_mode_list", "count", "negative_count", "seeds", "reducer"])
def test_huge_ints_elsewhere_are_the_clients_error_too(over):
    with pytest.raises(CompatError):
        plan_generation(classify(load(req(**over))).reqs)
