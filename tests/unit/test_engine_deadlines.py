"""The engine's deadline rules in process: the cost model, refusal at receipt, earliest-deadline-first,
elastic counts, out-of-memory re-planning, memory caps (see core/deadlines.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from candidate_scheduler.core.messages import Heartbeat, Registration
from tests.unit.test_engine import Harness, capability, expected, reduced  # noqa: F401

LABEL = "64x64h16f5"  # SamplingSpec().forward_label()


def calibrated(h: Harness, worker_id: str, capacity: int = 8, per_row: float = 0.01, fixed: float = 0.05):
    """A worker whose warm-up profile says a forward takes fixed + per_row * rows seconds."""
    profile = tuple((LABEL, r, fixed + per_row * r) for r in (1, capacity // 2, capacity))
    return h.take(h.engine.register(worker_id.encode(), Registration(worker_id, capability(), capacity,
                                                                     profile=profile), h.now))


def test_engine_cost_model_predicts_from_the_warm_up_profile():
    h = Harness()
    calibrated(h, "w1")
    assert h.engine.cost.forward_s("w1", LABEL, 4) == pytest.approx(0.09)
    # an unseen shape borrows the profiled line, scaled by video tokens (4x the pixels)
    assert h.engine.cost.forward_s("w1", "128x128h16f5", 4) == pytest.approx(0.36)
    h.submit("g", count=4, steps=10)
    assert h.engine.assignments[h.work[0].batch_id].predicted_s == pytest.approx(0.9)


def test_engine_refuses_an_unmeetable_deadline_at_once():
    h = Harness(batching="step")
    calibrated(h, "w1")
    h.submit("busy", count=8, steps=20)  # 20 x 0.13 s
    h.submit("late", count=4, steps=10, deadline_s=1.0)  # must wait ~2.6 s for rows
    r = h.reply("late")
    assert r.status == "rejected" and r.error_code == "deadline_unmeetable"
    assert "predicted completion" in r.error and "deadline of 1.000 s" in r.error
    h.submit("fine", count=4, steps=10, deadline_s=10.0)
    assert "fine" not in h.replies and h.engine.status("fine").state in ("admitted", "running")


def test_engine_orders_deadlines_first_and_never_starves_best_effort_groups():
    h = Harness(best_effort_s=5.0)
    h.register("w1", capacity=2)
    h.submit("busy", count=2)
    h.submit("besteffort", count=2)
    h.advance(1.0)
    h.submit("urgent", count=2, deadline_s=2.0)  # due before the best-effort group's horizon
    h.submit("relaxed", count=2, deadline_s=30.0)  # due after it
    h.run_all()
    order = [w.slices[0].dispatch.request_id for w in h.work]
    assert order == ["busy", "urgent", "besteffort", "relaxed"]


def test_engine_elastic_count_serves_the_first_n_candidates_of_the_full_group():
    h = Harness(batching="step")
    calibrated(h, "w1", capacity=8, per_row=0.05, fixed=0.0)
    h.submit("full", count=8, seed=77, steps=4)
    h.run_all()
    full = h.reply("full")
    h.submit("busy", count=4, steps=40)  # 40 x 0.2-0.4 s on the worker's rows
    h.submit("elastic", count=8, seed=77, steps=4, deadline_s=9.0, candidates_min=2)
    h.run_all()
    r = h.reply("elastic")
    assert r.status == "done" and 2 <= r.metrics["served_count"] < 8
    n = r.metrics["served_count"]
    assert r.metrics["requested_count"] == 8 and len(r.candidate_seeds) == n
    assert tuple(r.candidate_seeds) == tuple(full.candidate_seeds[:n])
    np.testing.assert_array_equal(r.candidates, full.candidates[:n])
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))


def test_engine_out_of_memory_replans_smaller_slices_instead_of_failing():
    h = Harness()
    h.register("w1", capacity=8)
    h.submit("g", count=8, seed=3)
    h.answer(h.work[0], status="error", error_code="out_of_memory")
    assert h.engine.workers["w1"].capacity == 7 and "g" not in h.replies
    h.run_all()
    r = h.reply("g")
    assert r.status == "done" and r.metrics["microbatches"] == 2
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))


def test_engine_memory_budget_caps_a_cuda_workers_rows():
    h = Harness(batching="step")

    def register(budget: int) -> None:
        h.take(h.engine.register(b"w1", Registration("w1", capability(), 8, device="cuda", memory_budget_bytes=budget),
                                 h.now))
        for rows, peak in ((2, 300), (4, 500)):  # 100 + 100 * rows bytes, as the worker's results report
            h.engine.cost.observe_group("w1", LABEL, {"rows": rows, "peak_memory_bytes": peak, "device": "cuda"})
        h.engine.rows_changed()

    register(1000)
    assert h.engine.rows_of(h.engine.workers["w1"]) == 9 - 1  # min(capacity 8, (1000 - 100) // 100 = 9)
    register(600)  # the worker came back with a smaller budget
    assert h.engine.rows_of(h.engine.workers["w1"]) == 5
    # a new group is sliced for the rows the worker may hold, not its nominal capacity, and runs
    h.submit("g", count=8, seed=4)
    assert h.work and max(len(s.dispatch.candidate_ids) for w in h.work for s in w.slices) <= 5
    h.run_all()
    assert h.reply("g").status == "done"


@pytest.mark.parametrize("field, value", [("deadline_s", 0.0), ("deadline_s", -1.0), ("deadline_s", 1e9),
                                          ("min_count", 9), ("min_count", 0)])
def test_engine_bad_deadlines_and_min_counts_are_invalid(field, value):
    h = Harness()
    h.register("w1")
    kw = {"deadline_s": value} if field == "deadline_s" else {"candidates_min": value}
    h.submit("g", count=8, **kw)
    r = h.reply("g")
    assert r.status == "invalid" and field in (r.metrics.get("error_field") or "")
    h.submit("ok", count=2)
    h.run_all()
    assert h.reply("ok").status == "done"




def test_engine_backfills_a_reserved_worker_only_with_work_done_before_the_head_could_start():
    h = Harness(batching="step")
    calibrated(h, "w1", capacity=8)
    h.submit("running", count=6, steps=100)  # ~100 x 0.11 s before its 6 rows free
    h.submit("large", count=8, steps=4)  # blocked: it reserves the worker
    h.submit("quick", count=2, steps=4)  # done in ~0.5 s, long before "large" could start: backfilled
    h.submit("slow", count=1, steps=400)  # would still hold a row when "large" could start: waits
    placed = [w.slices[0].dispatch.request_id for w in h.work]
    assert placed == ["running", "quick"]
    h.run_all()
    order = [w.slices[0].dispatch.request_id for w in h.work]
    assert order.index("large") < order.index("slow")  # the head was not delayed by a backfill


def test_the_warm_up_profiles_each_shapes_fixed_cost_and_every_reply_shows_its_forecasts():
    from candidate_scheduler.worker.null_adapter import NullAdapter
    from candidate_scheduler.worker.profile import warm_up

    records = warm_up(NullAdapter(8), 8, [(64, 64), (128, 128)])
    fixed = {label: s for label, rows, s in records if rows == 0}
    assert set(fixed) == {"64x64h16f5", "128x128h16f5"}  # one fixed cost per shape, not borrowed
    assert {rows for _label, rows, _s in records} == {0, 1, 4, 8}

    h = Harness()
    profile = ((LABEL, 1, 0.02), (LABEL, 8, 0.09), (LABEL, 0, 0.5), ("256x256h16f5", 0, 4.0))
    h.take(h.engine.register(b"w1", Registration("w1", capability(), 8, profile=profile), h.now))
    assert h.engine.cost.overhead_s("w1", "256x256h16f5") == pytest.approx(4.0)  # its own, not 64x64's x16
    h.submit("g", count=8, steps=10)
    predicted = h.engine.assignments[h.work[0].batch_id].predicted_s
    assert predicted == pytest.approx(0.5 + 10 * 0.09)  # the fixed cost, then 10 steps of 8 rows
    h.advance(1.25)
    h.answer(h.work[0])
    [f] = h.reply("g").metrics["forecasts"]
    assert f == {"label": LABEL, "rows": 8, "predicted_s": pytest.approx(predicted), "measured_s": pytest.approx(1.25)}


def test_a_workers_step_delay_is_in_its_profile_but_not_slept(monkeypatch):
    """`--step-delay` (the null worker's GPU stand-in) slows every step, so the profile carries it; the
    warm-up slept it nine times (27 s before a 3 s-step worker registered) to measure what it asked for."""
    import time
    import types

    from candidate_scheduler.worker import profile
    from candidate_scheduler.worker.null_adapter import NullAdapter

    slept = []
    monkeypatch.setattr(profile, "time", types.SimpleNamespace(perf_counter=time.perf_counter, sleep=slept.append))
    records = profile.warm_up(NullAdapter(8), 8, [(64, 64)], step_delay_s=3.0)
    steps = [s for _label, rows, s in records if rows > 0]
    assert len(steps) == 3 and all(3.0 <= s < 3.5 for s in steps)
    assert slept == []


def test_a_shapes_fixed_cost_leaves_out_what_only_its_first_start_pays():
    import time

    from candidate_scheduler.worker.null_adapter import NullAdapter
    from candidate_scheduler.worker.profile import warm_up

    class FirstStartSlow(NullAdapter):  # a shape's first start pays a one-time cost (kernel selection)
        def __init__(self, rows: int):
            super().__init__(rows)
            self.seen = set()

        def start(self, item):
            shape = item.images.shape[1:3]
            if shape not in self.seen:
                self.seen.add(shape)
                time.sleep(0.5)
            return super().start(item)

    records = warm_up(FirstStartSlow(8), 8, [(64, 64), (128, 128)])
    fixed = [s for _label, rows, s in records if rows == 0]
    assert len(fixed) == 2 and max(fixed) < 0.25


def test_an_elastic_group_at_a_shape_a_live_worker_has_not_measured_is_served_at_its_minimum():
    h = Harness(batching="step")
    calibrated(h, "w1")  # profiled at 64x64 only
    big = {"height": 128, "width": 128}
    h.submit("unmeasured", count=8, steps=4, deadline_s=60.0, candidates_min=2, sampling=big)
    h.run_all()
    assert h.reply("unmeasured").metrics["served_count"] == 2  # a borrowed forecast promises nothing
    h.submit("measured", count=8, steps=4, deadline_s=60.0, candidates_min=2)
    h.run_all()
    assert h.reply("measured").metrics["served_count"] == 8  # plenty of time, at a shape it knows
    # w1's heartbeat reports the 128x128 forwards it ran: now it has measured the shape
    h.take(h.engine.heartbeat(b"w1", Heartbeat("w1", forwards=((2, 0.09, "128x128h16f5"),)), h.now))
    h.submit("learned", count=8, steps=4, deadline_s=60.0, candidates_min=2, sampling=big)
    h.run_all()
    assert h.reply("learned").metrics["served_count"] == 8
    calibrated(h, "w2")  # joins, profiled at 64x64 only: a forecast would borrow its 128x128 line
    h.submit("joined", count=8, steps=4, deadline_s=60.0, candidates_min=2, sampling=big)
    h.run_all()
    assert h.reply("joined").metrics["served_count"] == 2


def test_two_slices_of_a_group_in_one_assignment_are_one_forecast():
    h = Harness(batching="dispatch")
    calibrated(h, "small", capacity=4)  # slices are sized for it: 8 candidates are two slices of 4
    calibrated(h, "big", capacity=8)
    h.submit("g", count=8, steps=4)
    [work] = h.work  # the big worker takes both slices in one batch
    assert [s.dispatch.slice_index for s in work.slices] == [0, 1]
    h.run_all()
    [f] = h.reply("g").metrics["forecasts"]
    assert f["rows"] == 8


def test_an_assignment_sent_to_wait_on_the_worker_is_predicted_to_end_after_what_runs_there():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)  # held work is sent at once
    calibrated(h, "w1")  # 8 rows; a forward takes 0.05 + 0.01 per row
    h.submit("g", count=11, steps=10)  # two slices, 6 + 5 rows: the second waits there for rows
    first, second = (h.engine.assignments[w.batch_id] for w in h.work)
    assert (first.rows, second.rows) == (6, 5)
    assert first.predicted_s == pytest.approx(10 * 0.11)
    # it starts when the first is done (placed in the same pass): 1.1 s, then 10 forwards of 5 rows
    assert second.predicted_s == pytest.approx(10 * 0.11 + 10 * 0.10)


def test_stats_say_what_margin_the_forecasts_multiply_every_duration_by():
    h = Harness()
    calibrated(h, "w1")
    assert h.engine.stats()["forecast_margin"] == 1.0  # nothing measured yet
    for _ in range(50):
        h.engine.cost.observe_error("w1", 1.0, 1.5)  # every assignment took 1.5x its prediction
    assert h.engine.stats()["forecast_margin"] == pytest.approx(1.5)


def test_a_backfill_goes_only_into_free_rows_never_into_spare_rows_ahead_of_the_head():
    """Backfill is judged as if the unit started now. In spare rows (prefetch) it would wait on the
    worker instead and join when its rows free, ahead of the blocked head, which then waited for it."""
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    calibrated(h, "w1", capacity=8)
    h.submit("running", count=8, steps=100)  # every row busy: only spare rows left
    h.submit("large", count=8, steps=4, sampling={"guidance_scale": 2.0})  # another key: blocked, reserves
    h.submit("quick", count=2, steps=4)  # would finish long before the head could start, if it started now
    assert [w.slices[0].dispatch.request_id for w in h.work] == ["running"]
    h.run_all()
    order = [w.slices[0].dispatch.request_id for w in h.work]
    assert order.index("large") < order.index("quick")
