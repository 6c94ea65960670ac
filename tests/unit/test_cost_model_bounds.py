"""The cost model and its metrics against what a broken or hostile worker (or client) can send: labels
that parse to no scale, more labels than any fleet runs, timings that are not times."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from candidate_scheduler.core import cost_model
from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import Heartbeat, Registration
from candidate_scheduler.service.metrics import PREFIX, SchedulerMetrics
from tests.unit.test_engine import Harness, capability

LABEL = "64x64h16f5"  # SamplingSpec().forward_label()


def register(h: Harness, worker_id: str, profile) -> None:
    h.take(h.engine.register(worker_id.encode(), Registration(worker_id, capability(), 8, profile=profile), h.now))


@pytest.mark.parametrize("label", ["0x0h0", "0x64h16f5", "64x0h16f5"])
def test_a_profiled_shape_of_no_video_tokens_does_not_fail_groups_at_other_shapes(label):
    # Such a shape is no scale to borrow from: before, a group at a shape the worker had not measured
    # borrowed its line, divided by its zero tokens, and failed with internal_error.
    h = Harness(batching="step")
    register(h, "w1", ((label, 4, 0.05), (label, 8, 0.09)))
    h.submit("g", count=4, steps=10, deadline_s=60.0)
    assert "g" not in h.replies  # admitted, not failed
    h.run_all()
    assert h.reply("g").status == "done"
    assert math.isfinite(h.engine.cost.forward_s("w1", LABEL, 4))


@pytest.mark.parametrize("label", ["9" * 5000 + "x16h16", "16x" + "9" * 400 + "h16"])
def test_a_label_whose_numbers_python_cannot_convert_is_no_scale_and_fails_nothing(label):
    # 5,000 digits is over CPython's int-from-string limit (ValueError); 400 is an int no float holds
    # (OverflowError): either raised inside the forecast of every group that borrowed a line
    assert cost_model.video_tokens(label) == 1.0
    h = Harness(batching="step")
    register(h, "w1", ((label, 4, 0.05), (LABEL, 4, 0.09)))
    h.submit("g", count=4, steps=10, deadline_s=60.0, sampling={"height": 128, "width": 128})
    assert "g" not in h.replies
    h.run_all()
    assert h.reply("g").status == "done"


def test_a_workers_heartbeats_cannot_grow_its_cost_model_without_bound():
    h = Harness(batching="step")
    register(h, "w1", ((LABEL, 4, 0.09),))
    for k in range(8):
        forwards = tuple((1, 0.01, f"junk{k}-{i}") for i in range(1024))
        h.take(h.engine.heartbeat(b"w1", Heartbeat("w1", forwards=forwards), h.now))
    kept = h.engine.cost.workers["w1"]
    assert len(kept.forward) <= cost_model.MAX_LABELS
    assert "junk7-1023" in kept.forward  # the labels seen last are the ones kept


def test_a_clients_many_shapes_keep_the_cost_model_bounded_and_the_labels_in_use_known():
    # every fps is a new forward label: a client cycling through them must not grow the model for ever
    model = CostModel()
    model.observe_forward("w1", LABEL, 4, 0.09)
    for fps in range(1, 4 * cost_model.MAX_LABELS):
        model.observe_forward("w1", f"64x64h16f{fps}", 4, 0.09)
        model.observe_fixed("w1", f"64x64h16f{fps}", 0.01)
        model.observe_forward("w1", LABEL, 4, 0.09)  # the shape served all along stays measured
    w = model.workers["w1"]
    assert len(w.forward) <= cost_model.MAX_LABELS and len(w.overhead) <= cost_model.MAX_LABELS
    assert model.knows("w1", LABEL)


def test_a_label_no_forward_label_could_be_is_not_kept():
    model = CostModel()
    model.observe_forward("w1", "x" * (cost_model.MAX_LABEL_CHARS + 1), 4, 0.09)
    model.observe_fixed("w1", "x" * (cost_model.MAX_LABEL_CHARS + 1), 0.01)
    assert not model.calibrated("w1")
    assert not model.workers.get("w1") or not model.workers["w1"].overhead


def sample(registry, name, **labels) -> float:
    v = registry.get_sample_value(PREFIX + name, labels)
    return 0.0 if v is None else v


def test_a_workers_nan_inf_or_negative_forward_timings_do_not_poison_the_forward_metrics():
    registry = CollectorRegistry()
    engine = Engine(EngineConfig(prefetch=0), metrics=SchedulerMetrics(registry))
    engine.register(b"w1", Registration("w1", capability(), 8, profile=((LABEL, 4, 0.09),)), 100.0)
    forwards = ((4, 0.1, LABEL), (4, math.nan, LABEL), (4, math.inf, LABEL), (4, -1.0, LABEL), (-3, 0.1, LABEL),
                (0, 0.1, LABEL))
    engine.heartbeat(b"w1", Heartbeat("w1", forwards=forwards), 101.0)
    # one forward is a forward: the rest are not times (or not rows) and are left out of every series
    assert sample(registry, "forward_seconds_sum", rows="4") == pytest.approx(0.1)
    assert sample(registry, "forward_seconds_count", rows="4") == 1
    assert sample(registry, "forward_rows_sum") == 4 and sample(registry, "forward_rows_count") == 1


def test_prediction_ratios_that_are_not_ratios_are_left_out():
    registry = CollectorRegistry()
    sm = SchedulerMetrics(registry)
    sm.prediction(2.0, 3.0)
    sm.prediction(math.inf, 3.0)
    sm.prediction(2.0, math.nan)
    sm.prediction(math.nan, 1.0)
    sm.prediction(2.0, -1.0)
    assert sample(registry, "prediction_ratio_count") == 1
    assert sample(registry, "prediction_ratio_sum") == pytest.approx(1.5)


def test_a_forward_time_too_large_to_fit_does_not_make_the_worker_free_and_admit_the_unmeetable():
    # 1e308 s is finite, so it was kept: the fit's sums overflowed to inf, its line became NaN, and every
    # forward on the worker was predicted to take 0 s from then on -- for good
    h = Harness(batching="step")
    register(h, "w1", tuple((LABEL, r, 0.05 + 0.01 * r) for r in (1, 4, 8)))
    h.take(h.engine.heartbeat(b"w1", Heartbeat("w1", forwards=((8, 1e308, LABEL), (8, 1e308, LABEL))), h.now))
    assert h.engine.cost.forward_s("w1", LABEL, 8) == pytest.approx(0.13)
    h.submit("late", count=8, steps=10, deadline_s=0.5)  # 10 forwards of 8 rows: 1.3 s
    r = h.reply("late")
    assert r.status == "rejected" and r.error_code == "deadline_unmeetable"


def test_a_fixed_cost_too_large_to_be_one_is_not_kept():
    model = CostModel()
    model.observe_forward("w1", LABEL, 4, 0.09)
    model.observe_fixed("w1", LABEL, 0.02)
    model.observe_fixed("w1", LABEL, 1e308)
    model.observe_group("w1", LABEL, {"condition_s": 2.0**53, "groups": 1})
    assert model.overhead_s("w1", LABEL) == pytest.approx(0.02)


def test_a_cfg_shape_borrowed_from_the_profile_costs_its_two_copies_of_every_row():
    # The warm-up profiles no CFG shape (guidance 1.0), and a CFG forward runs each row twice
    # (worker/cosmos3_step.py: [uncond; cond], batched or serial), reported at the group's rows. Borrowed
    # at the tokens of its shape alone, a CFG group was forecast at half its cost until measured: a
    # deadline it could not keep was admitted (and refused once the worker had run one).
    def decision(measured: bool) -> str:
        h = Harness(batching="step")
        register(h, "w1", tuple((LABEL, r, 0.05 + 0.01 * r) for r in (1, 4, 8)))  # 8 rows: 0.13 s a forward
        if measured:
            forwards = tuple((r, 2 * (0.05 + 0.01 * r), LABEL + "+cfg") for r in (1, 4, 8))
            h.take(h.engine.heartbeat(b"w1", Heartbeat("w1", forwards=forwards), h.now))
        # 10 CFG forwards of 8 rows: 2.6 s measured, 1.3 s borrowed at the shape's tokens alone
        h.submit("cfg", count=8, steps=10, deadline_s=2.0, sampling={"guidance_scale": 5.0})
        return h.replies["cfg"][0].error_code if "cfg" in h.replies else "admitted"

    assert decision(measured=True) == "deadline_unmeetable"
    assert decision(measured=False) == "deadline_unmeetable"
    model = CostModel()
    model.observe_forward("w1", LABEL, 4, 0.09)
    assert model.forward_s("w1", LABEL + "+cfg", 4) == pytest.approx(2 * 0.09)
    model.observe_forward("w1", LABEL + "+cfg", 4, 0.2)
    assert model.forward_s("w1", LABEL, 8) == pytest.approx(0.18)  # its own line: nothing borrowed


def test_one_workers_absurdly_fast_profile_does_not_zero_the_fleets_rate_once_it_learns():
    # 20 honest workers and one whose profile says a forward of 8 rows takes 1e-300 s: its rate (8e300)
    # swamped the fleet's rate sum, and when its first real forward mended the sum (old rate out, new
    # in) every other worker's rate went with it -- 0.0, and the fluid pipe divided by it
    from candidate_scheduler.core import fluid
    from tests.unit.test_engine import submission

    h = Harness(batching="step", max_queued_groups=10_000)
    for i in range(20):
        register(h, f"w{i}", tuple((LABEL, r, 0.05 + 0.01 * r) for r in (1, 4, 8)))
    register(h, "bogus", ((LABEL, 8, 1e-300),))
    h.submit("first", count=1, steps=10, deadline_s=5.0)  # the pipe's sums are built with the bogus rate
    assert "first" not in h.replies
    h.take(h.engine.heartbeat(b"bogus", Heartbeat("bogus", forwards=((8, 0.13, LABEL),)), h.now))
    honest = 20 * 8 / 0.13
    assert fluid.Pipe(h.engine.snapshot(h.now)).rate(LABEL) >= honest
    for i in range(200):  # best effort, due 30 s after receipt: ahead of a group due in 40 s
        h.take(h.engine.submit(("client", f"q{i}"), submission(f"q{i}", count=1, seed=i, steps=10), h.now,
                               plan=False))
    h.submit("behind", count=1, steps=10, deadline_s=40.0)  # 200 ten-step groups on 168 rows: seconds
    assert "behind" not in h.replies  # before: failed, internal_error (ZeroDivisionError)


def test_a_forward_of_more_rows_than_any_worker_runs_is_not_kept():
    # a broken worker's count: fitted, it pulled the line of every real batch toward its own time
    model = CostModel()
    model.observe_forward("w1", LABEL, 8, 0.13)
    model.observe_forward("w1", LABEL, 2**40, 1e-6)
    assert model.forward_s("w1", LABEL, 8) == pytest.approx(0.13)


def test_the_cost_model_metrics_have_a_fixed_set_of_series_whatever_the_workers_report():
    # the brief's concern: a worker's rows and times, and the labels it names, reach the metrics; the
    # forward latency is labelled by rows rounded to a closed set, and no label names a shape or a worker
    registry = CollectorRegistry()
    sm = SchedulerMetrics(registry)

    def series() -> set:
        return {(s.name, tuple(sorted(s.labels.items()))) for fam in registry.collect() for s in fam.samples
                if not s.name.endswith("_created")}

    before = series()
    for rows in (-1, 0, 1, 3, 255, 256, 257, 10**9, 2**62):
        for seconds in (0.0, 0.01, 1e9, math.nan, math.inf, -1.0):
            sm.forward(rows, seconds)
            sm.prediction(seconds, rows)
    assert series() == before
