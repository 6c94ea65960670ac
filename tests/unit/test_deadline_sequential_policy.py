"""Deadline forecasts slice a group as admission does: under the `sequential` policy a group over a
worker's rows runs one candidate a slice, each with its own fixed cost (conditioning) -- forecast as two
balanced slices, a group no worker could finish in time was admitted."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.messages import Registration
from tests.unit.test_engine import Harness, capability
from tests.unit.test_engine_deadlines import LABEL

# a forward of 8 rows takes 0.13 s; each slice's fixed cost (its conditioning) 0.5 s
PROFILE = ((LABEL, 1, 0.06), (LABEL, 4, 0.09), (LABEL, 8, 0.13), (LABEL, 0, 0.5))


@pytest.mark.parametrize("policy, admitted", [("sequential", False), ("microbatch", True)])
def test_a_group_sliced_one_candidate_each_is_forecast_with_each_slices_fixed_cost(policy, admitted):
    h = Harness(policy=policy)
    h.take(h.engine.register(b"w1", Registration("w1", capability(), 8, profile=PROFILE), h.now))
    # microbatch: 2 slices of 8, each 0.5 + 10 x 0.13 = 1.8 s: 3.6 s. sequential: 16 slices of 1, 8 at a
    # time on the worker, each batch 8 x 0.5 + 10 x 0.13 = 5.3 s: over the deadline with the first
    h.submit("g", count=16, steps=10, deadline_s=5.0)
    if admitted:
        assert "g" not in h.replies
    else:
        r = h.reply("g")
        assert r.status == "rejected" and r.error_code == "deadline_unmeetable", r
