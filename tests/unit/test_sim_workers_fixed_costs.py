"""The simulated workers deadline forecasts start from (`PlanningSnapshot.sim_workers`) carry the fixed
cost (conditioning) of what a worker holds, as the planner's own predictions do: a running assignment
still being conditioned, and one held behind it, which is conditioned when it starts. Without them, a
group queued behind was forecast to start that much early."""

from __future__ import annotations

import math

import pytest

from candidate_scheduler.core.forecast import forecast
from candidate_scheduler.core.messages import Registration
from tests.unit.test_engine import Harness, capability
from tests.unit.test_engine_deadlines import LABEL


@pytest.mark.parametrize("conditioning", ["inline", "thread"])
@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_what_a_worker_holds_is_forecast_to_end_when_the_planner_predicted(batching, conditioning):
    h = Harness(batching=batching, prefetch=1, prefetch_lead_s=math.inf, stagger=False)
    # a forward of 8 rows takes 0.13 s; a group's fixed cost (its conditioning) 0.5 s
    profile = ((LABEL, 1, 0.06), (LABEL, 4, 0.09), (LABEL, 8, 0.13), (LABEL, 0, 0.5))
    h.take(h.engine.register(b"w1", Registration("w1", capability(), 8, profile=profile,
                                                                     conditioning=conditioning), h.now))
    h.submit("a", count=8, steps=10)
    h.submit("b", count=8, steps=10)
    sent = {a.entries[0].request_id: a for a in h.engine.assignments.values()}
    assert set(sent) == {"a", "b"}  # "b" waits on the worker behind "a"
    predicted = {rid: a.sent_at + a.predicted_s for rid, a in sent.items()}
    assert predicted["a"] == pytest.approx(h.now + 0.5 + 1.3)
    for elapsed in (0.0, 0.2):  # still conditioning "a"
        snap = h.engine.snapshot(h.now + elapsed)
        ends = forecast(snap.now, snap.sim_workers(), [], snap.planned_cost, batching)
        assert ends["a"] == pytest.approx(predicted["a"]), elapsed
        assert ends["b"] == pytest.approx(predicted["b"]), elapsed
