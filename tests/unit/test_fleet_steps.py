"""The fleet benchmark's account of where utilisation goes (bench/fleet_steps.py) and the whole-batches
cap the report puts beside a dispatch burst (bench/fleet_report.py): pure arithmetic on figures."""

from __future__ import annotations

import time

import pytest

from candidate_scheduler.bench import fleet_report, fleet_steps
from candidate_scheduler.bench.fleet_steps import decompose, wait_for_steps


def _counters(steps: float, row_steps: float, seconds: float) -> dict[str, float]:
    return {"steps": steps, "row_steps": row_steps, "seconds": seconds}


def test_the_three_factors_multiply_to_the_utilisation():
    # 2 workers of 8 rows, 10 ms steps, a 1 s window: 150 steps of 7 rows on average, 1.6 s of stepping
    before = _counters(10, 80, 0.1)
    after = _counters(160, 80 + 1050, 1.7)
    f = decompose(before, after, row_steps=1050, capacity=8, step_s=0.01, workers=2, wall_s=1.0)
    assert f["steps"] == 150 and f["accounted"] == pytest.approx(1.0)
    assert f["fullness"] == pytest.approx(1050 / (150 * 8))
    assert f["step_accuracy"] == pytest.approx(150 * 0.01 / 1.6) and f["mean_step_ms"] == pytest.approx(1.6 / 150 * 1e3)
    assert f["stepping"] == pytest.approx(1.6 / 2.0)
    utilisation = 1050 * 0.01 / 8 / 2 / 1.0  # the fleet benchmark's definition
    assert f["fullness"] * f["step_accuracy"] * f["stepping"] == pytest.approx(utilisation)


def test_missing_step_records_show_as_unaccounted_and_an_empty_window_has_no_factors():
    f = decompose(_counters(0, 0, 0), _counters(100, 700, 1.1), row_steps=800, capacity=8, step_s=0.01, workers=1,
                  wall_s=1.2)
    assert f["accounted"] == pytest.approx(700 / 800)
    assert decompose(_counters(5, 40, 0.05), _counters(5, 40, 0.05), row_steps=0, capacity=8, step_s=0.01,
                     workers=1, wall_s=1.0) == {"steps": 0}


@pytest.mark.parametrize(("groups", "workers", "cap"), [
    (4000, 16, "0.977 (4,000 groups are 500 batches, 32 rounds of 16 workers)"),  # the K=16 target's burst
    (8000, 32, "0.977 (8,000 groups are 1,000 batches, 32 rounds of 32 workers)"),  # the K=32 target's
    (4096, 16, "1.000 (4,096 groups are 512 batches, 32 rounds of 16 workers)"),
    (500, 1, "0.992 (500 groups are 63 batches, 63 rounds of 1 workers)"),  # the last batch half full
])
def test_whole_batches_cap_a_dispatch_burst(groups, workers, cap):
    run = {"workload": {"groups": groups}, "workers": workers}
    assert fleet_report._whole_batches(run, 8) == f"; whole batches allow at most {cap}"


def test_without_a_metrics_url_nothing_is_waited_for():
    t0 = time.monotonic()
    assert wait_for_steps(None, _counters(0, 0, 0), row_steps=100) == _counters(0, 0, 0)
    assert time.monotonic() - t0 < 0.5


class _Scrapes:
    """The scheduler's step counters as successive scrapes would find them (the last one repeated)."""

    def __init__(self, *row_steps: float):
        self.values = list(row_steps)
        self.calls = 0

    def __call__(self, _url):
        value = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        return {"candidate_scheduler_forward_rows_count": value / 8, "candidate_scheduler_forward_rows_sum": value,
                'candidate_scheduler_forward_seconds_sum{rows="8"}': value / 800}


def test_the_wait_ends_when_the_window_is_recorded(monkeypatch):
    scrapes = _Scrapes(100, 140, 180, 200, 200)
    monkeypatch.setattr(fleet_steps, "scrape", scrapes)
    after = fleet_steps.wait_for_steps("http://metrics", _counters(12.5, 100, 0.125), row_steps=100)
    assert after["row_steps"] == 200 and scrapes.calls == 4  # the fourth scrape had all 100 rows x steps


def test_with_groups_that_did_not_finish_the_wait_settles_past_the_total(monkeypatch):
    # an expired group's steps came after the answered ones reached the total: they must not fall into
    # the next window
    scrapes = _Scrapes(100, 200, 230, 230)
    monkeypatch.setattr(fleet_steps, "scrape", scrapes)
    after = fleet_steps.wait_for_steps("http://metrics", _counters(12.5, 100, 0.125), row_steps=100, settle=True,
                                       settle_s=0.25)
    assert after["row_steps"] == 230 and scrapes.calls >= 5
    # a window whose records never arrive gives up, and shows it
    monkeypatch.setattr(fleet_steps, "scrape", _Scrapes(100))
    t0 = time.monotonic()
    short = fleet_steps.wait_for_steps("http://metrics", _counters(12.5, 100, 0.125), row_steps=100, timeout_s=0.3)
    assert short["row_steps"] == 100 and 0.3 <= time.monotonic() - t0 < 1.0
