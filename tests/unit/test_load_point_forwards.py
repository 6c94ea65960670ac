"""A load point's rows per forward (bench/load_shape.py) come from the scheduler's `forward_rows` histogram
read around the point. A worker reports its forwards with its heartbeats, up to an interval (0.5 s) after
it ran them, so a scrape taken at the point's last reply misses its last forwards (measured against a
null worker: 14-22 of some 220) and the next point's window counts them. The window closes once they
are in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from candidate_scheduler.bench import load_shape
from candidate_scheduler.bench.load_plan import SMOKE, arrivals
from candidate_scheduler.bench.load_point import Outcome, PointRun
from candidate_scheduler.bench.load_shape import STEPS, ShapeBench

ROWS = "candidate_scheduler_forward_rows"


class _Progress:
    def set_description(self, _text):
        pass

    def update(self, _n):
        pass


class _Scrapes:
    """The scheduler's forward counters as successive scrapes find them: the point's first forwards at
    its last reply, the rest one heartbeat later (the last one repeated)."""

    def __init__(self, *counters: tuple[float, float]):
        self.values = [{ROWS + "_count": n, ROWS + "_sum": s} for n, s in counters]
        self.calls = 0

    def __call__(self, url, timeout_s: float = 5.0):
        self.calls += 1
        return dict(self.values[min(self.calls - 1, len(self.values) - 1)])


def _bench(monkeypatch, scrapes: _Scrapes, statuses: list[str] | None = None) -> tuple[ShapeBench, object]:
    shape = SMOKE.shapes[0]
    arm = SimpleNamespace(name="step", endpoint="tcp://unused", control="", metrics_url="http://unused/metrics",
                          cancel=None)
    bench = ShapeBench(shape, SMOKE, {"step": arm}, arm, _Progress(), seed=1)

    def fake_run_point(endpoint, rate, planned, slo_s, **_kwargs):
        states = statuses or ["done"] * len(planned)
        return PointRun(rate, [Outcome(p, status=s, latency_s=0.1) for p, s in zip(planned, states)], False, 1.0)

    monkeypatch.setattr(load_shape, "run_point", fake_run_point)
    monkeypatch.setattr(load_shape, "scrape", scrapes)
    return bench, arm


def test_the_window_closes_once_every_forward_of_its_groups_is_in(monkeypatch):
    # the point's groups (counts from the fixed sequence) step STEPS times each: that many row-steps
    shape = SMOKE.shapes[0]
    rate = 2.0
    row_steps = STEPS * sum(spec.count for _at, spec in arrivals(load_shape.group_sequence(shape.side, 1), rate,
                                                                  shape.window_s, shape.min_groups,
                                                                  shape.max_window_s))
    forwards = row_steps / 4  # 4 rows a forward, over the whole point
    scrapes = _Scrapes((100, 1000),  # before the point
                       (100 + forwards - 10, 1000 + row_steps - 80),  # at the last reply: 10 forwards of 8 missing
                       (100 + forwards, 1000 + row_steps))  # the next heartbeat
    bench, arm = _bench(monkeypatch, scrapes)
    row = bench.point(arm, rate, 10.0, "sweep")
    assert row["rows_per_forward"] == pytest.approx(4.0)
    assert row["rows_per_forward_source"] == "forward_rows histogram"


def test_a_window_whose_groups_did_not_all_finish_closes_once_the_counters_settle(monkeypatch):
    # a cancelled group stepped some of its steps: no count says when its records are in, so the window
    # waits until the counters stop moving
    scrapes = _Scrapes((0, 0), (10, 40), (12, 44), (12, 44))
    bench, arm = _bench(monkeypatch, scrapes, statuses=["cancelled"] * 200)
    monkeypatch.setattr(load_shape, "SETTLE_S", 0.2, raising=False)
    row = bench.point(arm, 2.0, 10.0, "search", search=True)
    assert row["rows_per_forward"] == pytest.approx(44 / 12)
