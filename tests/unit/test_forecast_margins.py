"""Forecast margins per worker (core/margins.py): a worker that runs late on every assignment plans with
its own lateness; the others keep theirs. A new worker plans with the fleet's until it has its own."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.change_log import ChangeLog
from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.fleet_terms import FleetTerms
from candidate_scheduler.core.margins import MIN_ERRORS
from candidate_scheduler.core.messages import Left
from tests.unit.test_engine import Harness
from tests.unit.test_engine_deadlines import LABEL, calibrated
from tests.unit.test_fleet_terms import View


def _calibrated_cost(*workers: str) -> CostModel:
    c = CostModel()
    for w in workers:
        for rows in (1, 8):
            c.observe_forward(w, LABEL, rows, 0.01 * rows)
    return c


def test_each_worker_plans_with_its_own_lateness_and_a_new_one_with_the_fleets():
    c = _calibrated_cost("honest", "liar", "new")
    for _ in range(20):
        c.observe_error("honest", 1.0, 1.0)
        c.observe_error("liar", 1.0, 10.0)  # its profile claims ten times its speed
    assert c.margin("honest") == 1.0 and c.margin("liar") == pytest.approx(10.0)
    assert c.margin() == pytest.approx(10.0)  # the fleet's 0.9 quantile: the liar's
    planned = c.with_margin()
    assert planned.forward_s("honest", LABEL, 8) == pytest.approx(0.08)
    assert planned.forward_s("liar", LABEL, 8) == pytest.approx(0.8)
    # too few errors of its own: the fleet's margin, whatever its own say so far
    for _ in range(MIN_ERRORS - 1):
        c.observe_error("new", 1.0, 1.0)
    assert c.margin("new") == pytest.approx(10.0)
    c.observe_error("new", 1.0, 1.0)
    assert c.margin("new") == 1.0
    c.forget("liar")
    c.observe_error("liar", 1.0, 50.0)  # a result after it left counts for the fleet only
    assert "liar" not in c.workers and c.margin("honest") == 1.0


def test_a_margin_that_moves_is_a_change_the_fleet_sums_mend():
    """The pipe's sums are kept across decisions and mended per changed worker: a worker's new margin,
    and the fleet's (for a worker with too few errors of its own), must reach them."""
    c = _calibrated_cost("a", "b", "c")
    workers = tuple(View(w, 8, False, 0.0) for w in "abc")
    log = ChangeLog()  # no view rebuilt: only the cost model changes here
    terms = FleetTerms((), c).follow(workers, log, {"a": 0, "b": 1, "c": 2})
    for i in range(3 * MIN_ERRORS):
        for wid, late in (("a", 1.0), ("b", 4.0 + i)):  # "c" has no error of its own: the fleet's margin
            c.observe_error(wid, 1.0, late)
            terms = terms.follow(workers, log, {"a": 0, "b": 1, "c": 2})
            afresh = FleetTerms(workers, c)
            assert terms.rate(LABEL) == pytest.approx(afresh.rate(LABEL))
            assert terms.best_run(LABEL, 8, 8, 4, True) == pytest.approx(afresh.best_run(LABEL, 8, 8, 4, True))
    assert c.margin("c") == c.margin() > c.margin("a") == 1.0
    # the planned rate: each worker's rows per forward, slowed by its own margin
    expected = sum(8 / (c.margin(w) * 0.08) for w in "abc")
    assert terms.rate(LABEL) == pytest.approx(expected)


def test_one_late_worker_does_not_make_the_others_refuse_deadlines_they_can_keep():
    h = Harness(batching="dispatch")
    calibrated(h, "honest")  # a forward of 8 rows: 0.13 s
    calibrated(h, "liar")  # the same profile, and every assignment takes ten times its prediction
    for i in range(12):
        h.submit(f"h{i}", count=8, steps=4)
        h.submit(f"l{i}", count=8, steps=4)
        sent = [w for w in h.work if w.batch_id in h.engine.assignments]
        assert sorted(w.identity for w in sent) == [b"honest", b"liar"]
        for w in sorted(sent, key=lambda w: w.identity):  # honest first: the clock only moves on
            a = h.engine.assignments[w.batch_id]
            h.now = a.sent_at + a.predicted_s * (10.0 if w.identity == b"liar" else 1.0)
            h.answer(w)
    assert h.engine.cost.margin("honest") == pytest.approx(1.0)
    assert h.engine.cost.margin("liar") == pytest.approx(10.0)
    stats = h.engine.stats()["workers"]
    assert stats["honest"]["forecast_margin"] == pytest.approx(1.0)
    assert stats["liar"]["forecast_margin"] == pytest.approx(10.0)
    # 10 forwards of 8 rows on the honest worker: 1.3 s; planned with the fleet's margin it was 13 s
    h.submit("urgent", count=8, steps=10, deadline_s=3.0)
    assert "urgent" not in h.replies, h.replies.get("urgent")
    h.run_all()
    assert h.reply("urgent").status == "done"
    # and one only the liar could run in time is still refused: its margin is its own
    h.submit("busy", count=8, steps=40)  # the honest worker's rows, for 40 x 0.13 s
    h.submit("tight", count=8, steps=10, deadline_s=3.0)  # 1.3 s promised by the liar's profile: 13 s
    r = h.reply("tight")
    assert r.status == "rejected" and r.error_code == "deadline_unmeetable"


def test_a_margin_moves_only_when_its_quantile_has_moved_by_more_than_a_step():
    """Every move re-plans the worker's terms: a quantile that moves by a hair at every result must not."""
    c = _calibrated_cost("w")
    for _ in range(10):
        c.observe_error("w", 1.0, 1.5)
    assert c.margin("w") == pytest.approx(1.5)
    stamp = c.version
    for _ in range(20):
        c.observe_error("w", 1.0, 1.505)  # the quantile is 1.505 now: within 1% of the margin
    assert c.margin("w") == pytest.approx(1.5) and c.version == stamp
    for _ in range(20):
        c.observe_error("w", 1.0, 1.6)
    assert c.margin("w") == pytest.approx(1.6) and c.version > stamp


def test_running_work_is_planned_to_end_at_the_margins_pace_not_ahead_of_it():
    """A running assignment's steps left were what its time so far bought at the unscaled cost, and were
    then run at the margin's pace: half its predicted time in, on a worker whose margin is 2, it was
    taken to be half done (a quarter, at the pace planned) and to end at 1.5x its prediction, not 2x."""
    h = Harness(batching="dispatch")
    calibrated(h, "w1")  # a forward of 8 rows: 0.13 s
    for _ in range(10):
        h.engine.cost.observe_error("w1", 1.0, 2.0)
    assert h.engine.cost.margin("w1") == pytest.approx(2.0)
    h.submit("busy", count=8, steps=10)
    a = next(iter(h.engine.assignments.values()))
    assert a.predicted_s == pytest.approx(1.3)
    h.advance(0.65)
    sim = h.engine.snapshot(h.now).sim_workers()[0]
    assert [item.steps_left for item in sim.items] == [pytest.approx(7.5)]  # 2.5 of 10 done at 0.26 s a step


def test_the_fleets_margin_and_the_largest_workers_are_exported_and_a_leaving_workers_goes_with_it():
    from prometheus_client import CollectorRegistry

    from candidate_scheduler.service.metrics import SchedulerMetrics

    registry = CollectorRegistry()
    h = Harness(batching="dispatch")
    h.engine.metrics = SchedulerMetrics(registry)

    def gauge(name: str) -> float:
        return registry.get_sample_value(f"candidate_scheduler_{name}")

    assert gauge("forecast_margin") == gauge("forecast_margin_max") == 1.0  # nothing measured: no margin
    calibrated(h, "honest")
    calibrated(h, "slow")
    for i in range(6):
        h.submit(f"h{i}", count=8, steps=4)
        h.submit(f"s{i}", count=8, steps=4)
        for w in sorted((w for w in h.work if w.batch_id in h.engine.assignments), key=lambda w: w.identity):
            a = h.engine.assignments[w.batch_id]
            h.now = a.sent_at + a.predicted_s * (3.0 if w.identity == b"slow" else 1.0)
            h.answer(w)
    assert gauge("forecast_margin_max") == pytest.approx(3.0)
    assert gauge("forecast_margin") == pytest.approx(h.engine.cost.margin()) and gauge("forecast_margin") > 1.0
    h.take(h.engine.worker_left(b"slow", Left("slow", "stopped"), h.now))
    assert gauge("forecast_margin_max") == pytest.approx(1.0)  # the honest worker's, all that is left


def test_the_margin_gauges_are_set_at_most_once_a_second_of_the_engines_clock():
    """Finding the largest margin reads every worker: with noisy errors a margin moves at most results,
    and the gauges would cost O(workers) per result."""
    from candidate_scheduler.core.no_metrics import NoMetrics

    class Spy(NoMetrics):
        def __init__(self):
            self.set_at: list[float] = []

        def forecast_margins(self, fleet, largest):
            self.set_at.append(h.now)

    h = Harness(batching="dispatch")
    h.engine.metrics = spy = Spy()
    calibrated(h, "w1")
    for i in range(40):  # every result 10 ms after the last, each a different error: the margin moves
        h.submit(f"g{i}", count=8, steps=4)
        [w] = [w for w in h.work if w.batch_id in h.engine.assignments]
        h.now += 0.01
        h.engine.assignments[w.batch_id].predicted_s = 0.01 / (1.0 + i / 10)  # later ones, later still
        h.answer(w)
    assert 1 <= len(spy.set_at) <= 2  # 0.4 s of results: the first move, then nothing within the second
    assert all(b - a >= 1.0 for a, b in zip(spy.set_at, spy.set_at[1:]))
