"""The forecast's fluid model of a running batch: joins slow everything running, fixed costs stall the
worker (or, on a worker that conditions aside, only delay the joiner), dispatch runs batches one after
another, and what no worker can hold never finishes."""

import itertools
import math

import pytest

from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.forecast import SimItem, SimWorker, forecast
from candidate_scheduler.core.planning import Unit

LABEL = "64x64h16f5"
KEY = (64, 64, 16, 5, "policy", False)


def cost(per_row: float = 0.01, fixed: float = 0.0) -> CostModel:
    c = CostModel()
    for rows in (1, 8):
        c.observe_forward("w", LABEL, rows, per_row * rows)
    if fixed:
        c.observe_group("w", LABEL, {"condition_s": fixed, "groups": 1})
    return c


_ORDER = itertools.count()


def job(rid: str, rows: int, steps: int, slice_index: int = 0) -> Unit:
    """A queued slice; slices are queued in the order they are made."""
    return Unit(rid, slice_index, tuple(range(rows)), ("bk",), KEY, (0.0, next(_ORDER), slice_index), steps, rows, LABEL)


def test_forecast_a_join_slows_the_groups_already_running():
    alone = forecast(0.0, [SimWorker("w", 8)], [job("a", 4, 10)], cost(), "step")
    assert alone["a"] == pytest.approx(0.4)  # 10 steps x 4 rows x 10 ms
    both = forecast(0.0, [SimWorker("w", 8)], [job("a", 4, 10), job("b", 4, 10)], cost(), "step")
    assert both["a"] == pytest.approx(0.8) and both["b"] == pytest.approx(0.8)  # every step carries 8 rows


def test_forecast_a_short_group_leaves_early_and_the_long_one_speeds_up():
    f = forecast(0.0, [SimWorker("w", 8)], [job("long", 4, 20), job("short", 4, 5)], cost(), "step")
    assert f["short"] == pytest.approx(5 * 0.08)
    assert f["long"] == pytest.approx(5 * 0.08 + 15 * 0.04)


def test_forecast_fixed_costs_stall_the_worker_and_dispatch_runs_batches_in_turn():
    c = cost(fixed=0.1)
    f = forecast(0.0, [SimWorker("w", 4)], [job("a", 4, 10), job("b", 4, 10)], c, "dispatch")
    assert f["a"] == pytest.approx(0.1 + 0.4) and f["b"] == pytest.approx(2 * (0.1 + 0.4))


def test_forecast_on_a_worker_that_conditions_aside_the_running_groups_step_on_while_a_joiner_is_conditioned():
    c = cost(fixed=0.1)

    def running(aside: bool) -> SimWorker:
        return SimWorker("w", 8, [SimItem((("old", 0),), 4, 4, 10.0, LABEL, KEY)], conditions_aside=aside)

    inline = forecast(0.0, [running(False)], [job("new", 4, 10)], c, "step")
    assert inline["old"] == pytest.approx(0.1 + 10 * 0.08) and inline["new"] == pytest.approx(0.9)
    aside = forecast(0.0, [running(True)], [job("new", 4, 10)], c, "step")
    # 2.5 steps of 4 rows while "new" is conditioned, then 7.5 together; "new" ends 2.5 steps later alone
    assert aside["old"] == pytest.approx(0.1 + 7.5 * 0.08)
    assert aside["new"] == pytest.approx(0.1 + 7.5 * 0.08 + 2.5 * 0.04)
    # two joiners queue on the one conditioning thread: the second starts stepping 0.1 s after the first
    both = forecast(0.0, [SimWorker("w", 8, conditions_aside=True)], [job("a", 4, 10), job("b", 4, 10)], c, "step")
    assert both["a"] == pytest.approx(0.2 + 7.5 * 0.08) and both["b"] == pytest.approx(0.8 + 2.5 * 0.04)
    stalled = forecast(0.0, [SimWorker("w", 8)], [job("a", 4, 10), job("b", 4, 10)], c, "step")
    assert stalled["a"] == stalled["b"] == pytest.approx(0.2 + 10 * 0.08)


def test_forecast_counts_the_work_already_running_and_what_cannot_be_held():
    running = SimItem((("old", 0),), 6, 6, 10.0, LABEL, KEY)
    f = forecast(0.0, [SimWorker("w", 8, [running])], [job("new", 4, 10), job("huge", 9, 1)], cost(), "step")
    assert f["new"] == pytest.approx(10 * 0.06 + 10 * 0.04)  # waits for the 6 running rows to leave
    assert math.isinf(f["huge"])


def test_the_margin_is_the_measured_90th_percentile_of_the_prediction_error():
    c = cost()
    assert c.margin() == 1.0  # nothing measured yet
    for _ in range(4):
        c.observe_error("w", 1.0, 2.0)
    assert c.margin() == 1.0  # too few to say
    c = cost()  # a fresh window
    for ratio in [0.8] * 10 + [1.0] * 8 + [1.3] * 2:
        c.observe_error("w", 1.0, ratio)
    assert c.margin() == pytest.approx(1.0)
    for _ in range(10):
        c.observe_error("w", 1.0, 1.5)
    assert c.margin() == pytest.approx(1.5)
    f = forecast(0.0, [SimWorker("w", 8)], [job("a", 4, 10)], c.with_margin(), "step")
    assert f["a"] == pytest.approx(1.5 * 0.4)


def test_the_margin_quantile_chooses_how_much_of_the_measured_tail_to_plan_for():
    errors = [1.0] * 85 + [1.2] * 13 + [2.0] * 2  # 100 assignments: 13% ran 20% over, 2% twice as long
    margins = {}
    for q in (0.5, 0.9, 0.95, 0.99, 1.0):
        c = CostModel(q)
        for ratio in errors:
            c.observe_error("w", 1.0, ratio)
        margins[q] = c.margin()
    assert margins == {0.5: 1.0, 0.9: pytest.approx(1.2), 0.95: pytest.approx(1.2), 0.99: pytest.approx(2.0),
                       1.0: pytest.approx(2.0)}


@pytest.mark.parametrize("q", [0.4, 1.01, -1.0])
def test_a_margin_quantile_outside_half_to_one_is_refused(q):
    from candidate_scheduler.core.engine import EngineConfig

    with pytest.raises(ValueError, match="margin_quantile"):
        CostModel(q)
    with pytest.raises(ValueError, match="margin_quantile"):
        EngineConfig(margin_quantile=q)


def test_a_group_asked_about_ends_only_with_its_last_slice_even_across_the_queue_read_in_chunks():
    # one 8-row worker reads the queue 80 slices at a time; the group asked about has slices 80, 81, 82
    fillers = [job(f"f{i}", 8, 1) for i in range(79)]
    ours = [job("x", 8, 1, slice_index=i) for i in range(3)]
    orders = {"x": ours[0].order[:2]}
    f = forecast(0.0, [SimWorker("w", 8)], fillers + ours, cost(), "dispatch", want=["x"], orders=orders)
    assert f["x"] == pytest.approx(82 * 0.08)  # every slice before it, then its three, one at a time


@pytest.mark.parametrize("mode", ["step", "dispatch"])
def test_a_forecast_ends_when_steps_are_shorter_than_the_clocks_resolution(mode):
    """Microsecond steps on a clock of hours (a null worker, a monotonic clock): a step's end can round to
    the instant it starts from. The forecast used to come back to that instant forever (the reliability
    suite's request fuzz hung the scheduler on it); it must end, at about the time the steps add up to."""
    now = 9849.373204697
    jobs = [job("a", 3, 7), job("b", 2, 13), job("c", 1, 5)]
    for per_row in (1e-7, 3e-8, 1.3e-9):
        f = forecast(now, [SimWorker("w", 8)], jobs, cost(per_row), mode)
        assert set(f) == {"a", "b", "c"} and all(now <= v < now + 1e-3 for v in f.values()), f


@pytest.mark.parametrize("mode", ["dispatch", "step"])
def test_forecast_sends_a_shape_only_where_it_is_not_refused(mode):
    """A worker one candidate of a shape ran out of memory is sent none of it (core/fleet_rows.py): the
    forecast's queue waits for the other worker, as the engine's does, and never ends if every worker refuses."""
    c = cost()
    for rows in (1, 8):
        c.observe_forward("v", LABEL, rows, 0.01 * rows)
    workers = [SimWorker("w", 8, refuses=frozenset({LABEL})), SimWorker("v", 8)]
    f = forecast(0.0, workers, [job("a", 4, 10), job("b", 4, 10)], c, mode)
    # both on v, eight rows a step (on both workers, 0.4 each)
    assert f["a"] == pytest.approx(0.8) and f["b"] == pytest.approx(0.8)
    nobody = forecast(0.0, [SimWorker("w", 8, refuses=frozenset({LABEL}))], [job("a", 4, 10)], c, mode)
    assert math.isinf(nobody["a"])
