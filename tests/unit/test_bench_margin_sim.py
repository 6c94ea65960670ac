"""bench/margin_sim.py: two simulated workers with one profile, one running 3x slower than it says,
against the real engine in simulated time. Each worker's forecasts carry its own margin, every group is
answered once, and a fleet of alike workers has nothing to refuse at this load."""

from __future__ import annotations

import pytest

from candidate_scheduler.bench import margin_sim


def test_a_slow_worker_carries_its_own_margin_and_every_group_is_answered():
    run = margin_sim.simulate(rate=6.0, seconds=10.0, count=4, deadline_s=1.0, seed=1, slowdown=3.0)
    assert run["groups"] == 60 and "no_reply" not in run["outcomes"]
    assert sum(run["outcomes"].values()) == run["groups"]
    assert run["worker_margins"]["a"] == pytest.approx(1.0) and run["worker_margins"]["b"] == pytest.approx(3.0)
    assert run["batches"]["a"] > run["batches"]["b"] > 0  # both serve; the fast one more
    assert run["in_time"] <= run["outcomes"]["done"]  # a done group may be late, never in time unanswered


def test_alike_workers_serve_every_group_in_time():
    run = margin_sim.simulate(rate=6.0, seconds=10.0, count=4, deadline_s=1.0, seed=1, slowdown=1.0)
    assert run["in_time"] == run["groups"] == run["outcomes"]["done"]
    assert run["worker_margins"] == {"a": 1.0, "b": 1.0}


def test_the_report_names_every_row():
    rows = [{"engine": "current", "rate": 6.0, "slowdown": 3.0, "groups": 10, "in_time": 8,
             "outcomes": {"done": 8, "deadline_unmeetable": 1, "deadline_exceeded": 1}, "fleet_margin": 3.0,
             "worker_margins": {"a": 1.0, "b": 3.0}, "goodput_groups_per_s": 0.8}]
    text = margin_sim.report(rows, "abc1234")
    assert "| 3 | current | 6 | 10 | 8 | 1 | 1 | - | 0.80 | 3.00 / 1.00 / 3.00 |" in text and "abc1234" in text
