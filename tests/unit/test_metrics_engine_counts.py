"""Engine counters as an operator reads them: a retry is counted only when something is retried (not
when a slice's retries are spent and its group fails), and groups_joined_total counts the slices that
joined a running batch, not the assignments that carried them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from candidate_scheduler.service.metrics import SchedulerMetrics
from tests.unit.test_engine import Harness, submission

P = "candidate_scheduler_"


def _with_metrics(h: Harness) -> CollectorRegistry:
    registry = CollectorRegistry()
    h.engine.metrics = SchedulerMetrics(registry=registry)
    return registry


def _value(registry, name, **labels) -> float:
    return registry.get_sample_value(P + name, labels) or 0.0


@pytest.mark.parametrize("retry_limit,retried", [(1, 0), (2, 1)])
def test_a_slice_whose_retries_are_spent_is_not_counted_as_retried(retry_limit, retried):
    h = Harness(retry_limit=retry_limit)
    registry = _with_metrics(h)
    h.register("w1")
    h.submit("g", count=2)
    for _ in range(retry_limit):
        h.answer(h.work[-1], status="error", error_code="worker_error")
    r = h.reply("g")
    assert (r.status, r.error_code) == ("failed", "retries_exhausted")
    assert _value(registry, "retries_total", reason="worker_error") == retried


def test_groups_joined_counts_the_slices_an_assignment_carries():
    h = Harness(batching="step")
    registry = _with_metrics(h)
    h.register("w1", capacity=8)
    h.submit("running", count=4, steps=8)
    for rid in ("a", "b"):  # a burst read before one planning pass: both join in one assignment
        h.take(h.engine.submit(("client", rid), submission(rid, count=1), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    joins = [w for w in h.work if w.join]
    assert len(joins) == 1 and len(joins[0].slices) == 2
    assert _value(registry, "groups_joined_total") == 2


def test_the_margin_gauges_catch_up_at_the_next_tick_after_a_quiet_second():
    """Margins are published at most once a second, on a result: a move within the second after one, with
    the fleet then idle, left the gauges stale for good (1.3 against the 4.5 STATS said)."""
    from tests.unit.test_engine_deadlines import calibrated

    h = Harness()
    registry = _with_metrics(h)
    calibrated(h, "w1")
    # each runs 0.2 s against a 0.06 s prediction (the margin is set, and published, at the fifth), then
    # three run 0.3 s within the second after that publication: the margin moves, the gauges wait
    for i, run_s in enumerate([0.2] * 5 + [0.3] * 3):
        h.submit(f"g{i}", count=1, steps=1)
        h.advance(run_s)
        h.answer(h.work[-1])
    stats = h.engine.stats()["forecast_margin"]
    assert _value(registry, "forecast_margin") < stats  # not published yet: within the second
    h.advance(2.0)
    h.take(h.engine.tick(h.now))
    assert _value(registry, "forecast_margin") == pytest.approx(stats)


def test_a_reply_that_cannot_be_built_is_counted_and_logged_like_every_fault(monkeypatch):
    from candidate_scheduler.core.group import Group
    from candidate_scheduler.core.messages import InternalFault

    h = Harness()
    registry = _with_metrics(h)
    h.register("w1")
    h.submit("g", count=2)

    def broken(self, reply):
        raise ValueError("no reply today")

    monkeypatch.setattr(Group, "result", broken)
    out = h.answer(h.work[0])
    r = h.reply("g")
    assert (r.status, r.error_code) == ("failed", "internal_error")
    assert _value(registry, "internal_errors_total", kind="reply") == 1  # STATS counted it; the metric did not
    faults = [m for m in out if isinstance(m, InternalFault)]
    assert len(faults) == 1 and faults[0].request_ids == ("g",) and "no reply today" in faults[0].traceback


def test_a_submission_answered_by_the_last_resort_refusal_is_counted_as_completed(monkeypatch):
    from candidate_scheduler.core import intake

    h = Harness()
    registry = _with_metrics(h)
    h.register("w1")

    def broken(sub):
        raise RuntimeError("validation fell over")

    monkeypatch.setattr(intake, "validate", broken)  # raises before the group is kept
    h.submit("g", count=2)
    assert h.reply("g").error_code == "internal_error"
    assert _value(registry, "groups_completed_total", outcome="failed") == 1
    assert _value(registry, "groups_received_total", api="native") == 1
