"""Atomic events: code that raises inside the engine fails only the groups it was working on, each
answered once with `internal_error`; nothing else is lost. Plus the outcome table, out-of-memory blame
and the reducer's stopwatch."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.core import deadlines, reducers
from candidate_scheduler.core import engine as engine_module
from candidate_scheduler.core import intake as intake_module
from candidate_scheduler.core.guard import Guard
from candidate_scheduler.core.messages import InternalFault, SliceOutcome
from candidate_scheduler.core.outcomes import Verdict, classify
from candidate_scheduler.core.planning import WorkerSlot
from tests.unit.test_engine import Harness, reduced, submission
from tests.unit.test_engine_deadlines import calibrated


def faults(h: Harness, out: list) -> list[InternalFault]:
    return [m for m in out if isinstance(m, InternalFault)]


def assert_internal_error(h: Harness, rid: str, where: str) -> None:
    r = h.reply(rid)  # exactly one reply
    assert r.status == "failed" and r.error_code == "internal_error", r
    assert where in r.error and "RuntimeError: injected" in r.error
    assert rid not in h.engine.groups and rid not in h.engine.pending


def poison(name: str):
    def raise_for(request_id: str) -> None:
        if request_id == name:
            raise RuntimeError("injected")
    return raise_for


def test_admission_that_raises_fails_that_group_alone(monkeypatch):
    h = Harness()
    h.register("w1")
    check = poison("bad")

    def admit(group, _real=h.engine.admit):
        check(group.request_id)
        return _real(group)

    monkeypatch.setattr(h.engine, "admit", admit)
    h.submit("ok1", count=2)
    out = h.submit("bad", count=2)
    h.submit("ok2", count=2)
    assert_internal_error(h, "bad", "submit")
    (fault,) = faults(h, out)
    assert fault.event == "submit" and fault.request_ids == ("bad",) and "Traceback" in fault.traceback
    h.run_all()
    assert h.reply("ok1").status == "done" and h.reply("ok2").status == "done"
    assert h.engine.stats()["internal_errors"] == 1 and not h.engine.groups


def test_validation_code_that_raises_before_the_group_is_kept_still_answers_it(monkeypatch):
    h = Harness()
    h.register("w1")
    real = intake_module.validate

    def validate(sub):
        if sub.request_id == "bad":
            raise RuntimeError("injected")
        return real(sub)

    monkeypatch.setattr(intake_module, "validate", validate)
    h.submit("bad", count=2)
    r = h.reply("bad")
    assert r.status == "failed" and r.error_code == "internal_error" and "injected" in r.error
    h.submit("ok", count=2)
    h.run_all()
    assert h.reply("ok").status == "done" and not h.engine.groups


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_planning_that_raises_on_one_group_fails_it_alone(monkeypatch, batching):
    h = Harness(batching=batching)
    h.register("w1", capacity=8)
    original = WorkerSlot.accepts
    check = poison("bad")

    def accepts(self, unit):
        check(unit.request_id)
        return original(self, unit)

    h.submit("busy", count=8)  # the worker is full: the rest waits
    h.submit("ok1", count=1)
    h.submit("bad", count=1)
    h.submit("ok2", count=1)
    monkeypatch.setattr(WorkerSlot, "accepts", accepts)
    if batching == "dispatch":  # dispatch plans without WorkerSlot.accepts: poison the batch it builds
        monkeypatch.undo()
        real = engine_module.schedule.plan_dispatch

        def plan_dispatch(queue, idle, on_unit=None, guard=None):
            return real(queue, idle, lambda rid: (on_unit(rid), check(rid)), guard)
        monkeypatch.setattr(engine_module.schedule, "plan_dispatch", plan_dispatch)
    h.answer(h.work[0])  # rows free: the planning pass meets "bad"
    assert_internal_error(h, "bad", "schedule")
    h.run_all()
    for rid in ("busy", "ok1", "ok2"):
        assert h.reply(rid).status == "done", rid


def test_a_reply_made_before_planning_raises_is_not_lost(monkeypatch):
    h = Harness()
    h.register("w1", capacity=2)
    h.submit("first", count=2)
    h.submit("bad", count=2)

    def plan(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(engine_module.schedule, "plan", plan)
    out = h.answer(h.work[0])  # "first" is done; the pass after it raises before it names a group
    assert h.reply("first").status == "done"
    assert faults(h, out) and faults(h, out)[0].event == "schedule" and faults(h, out)[0].request_ids == ()
    monkeypatch.undo()
    h.take(h.engine.tick(h.now))  # the next pass places "bad" as usual
    h.run_all()
    assert h.reply("bad").status == "done"


def test_a_forecast_that_raises_fails_the_group_it_was_for(monkeypatch):
    h = Harness(batching="step")
    calibrated(h, "w1")

    def forecast(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(deadlines, "forecast", forecast)
    h.submit("timed", count=2, steps=4, deadline_s=5.0)
    assert_internal_error(h, "timed", "submit")
    h.submit("plain", count=2, steps=4)  # no deadline: no forecast
    h.run_all()
    assert h.reply("plain").status == "done"


def test_a_reducer_that_raises_while_folding_fails_its_group_and_spares_its_batch_mates(monkeypatch):
    h = Harness()
    h.submit("a", count=2, seed=1)
    h.submit("bad", count=2, seed=2)
    h.submit("b", count=2, seed=3)
    h.register("w1", capacity=8)  # the three were waiting: they share one batch
    (send,) = h.work
    assert len(send.slices) == 3
    real = reducers.PartialReduction.fold
    bad = h.engine.groups["bad"].partial

    def fold(self, ids, actions):
        if self is bad:
            raise RuntimeError("injected")
        return real(self, ids, actions)

    monkeypatch.setattr(reducers.PartialReduction, "fold", fold)
    out = h.answer(send)
    assert_internal_error(h, "bad", "result")
    for rid in ("a", "b"):
        r = h.reply(rid)
        assert r.status == "done"
        np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))
    assert [f.request_ids for f in faults(h, out)] == [("bad",)]


def test_a_reply_that_cannot_be_built_is_still_answered_once(monkeypatch):
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)

    def result(self, reply):
        raise RuntimeError("injected")

    monkeypatch.setattr(engine_module.Group, "result", result)
    h.answer(h.work[0])
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == "internal_error" and "injected" in r.error


# ---- the outcome table ------------------------------------------------------------------------------------

CASES = [
    # (group live, outcome request id, status, error code, malformed) -> verdict
    (False, "g", "ok", None, None, Verdict.IGNORE),
    ("cancelled here", "g", "ok", None, None, Verdict.IGNORE),
    ("cancelled here", "g", "cancelled", None, None, Verdict.IGNORE),
    (True, "other", "ok", None, None, Verdict.RETRY),
    (True, "g", "ok", None, None, Verdict.FOLD),
    (True, "g", "ok", None, "bad array", Verdict.RETRY),
    (True, "g", "cancelled", None, None, Verdict.RETRY),  # not asked for: the worker's fault
    (True, "g", "error", "out_of_memory", None, Verdict.OUT_OF_MEMORY),
    (True, "g", "error", "model_error", None, Verdict.FAIL),
    (True, "g", "error", "bad_request", None, Verdict.FAIL),
    (True, "g", "error", "worker_error", None, Verdict.RETRY),
    (True, "g", "error", None, None, Verdict.RETRY),
    (True, "g", "mystery", None, None, Verdict.RETRY),
]


@pytest.mark.parametrize("live, rid, status, code, malformed, verdict", CASES)
def test_each_outcome_is_classified_once_by_the_table(live, rid, status, code, malformed, verdict):
    outcome = SliceOutcome(rid, status, (0,), error="boom" if code else None, error_code=code, malformed=malformed)
    judged = classify(bool(live), "g", outcome, cancelled_here=live == "cancelled here")
    assert judged.verdict is verdict
    if verdict is Verdict.FAIL:
        assert judged.detail == "boom"


# ---- out of memory: blame the rows in use, lower once, fail only one row alone ------------------------------


def test_out_of_memory_in_a_shared_step_lowers_the_worker_once_and_retries_every_group():
    h = Harness(batching="step")
    h.register("w1", capacity=8)
    for i in range(3):  # three one-candidate groups joined into one running batch
        h.submit(f"g{i}", count=1, seed=i)
    sends = list(h.work)
    assert len(sends) == 3
    for send in sends:  # the shared forward ran out of memory: every assignment answers so, and says which
        h.answer(send, status="error", error_code="out_of_memory", report={"oom_rows": 3, "oom_step": 5})
        assert h.engine.workers["w1"].capacity == 2  # 3 rows did not fit: lowered once, not per answer
    assert not h.replies
    h.run_all()
    for i in range(3):
        r = h.reply(f"g{i}")
        assert r.status == "done" and r.metrics["retries"] == 1


def test_out_of_memory_of_a_dispatch_batch_blames_its_rows_not_the_batch_waiting_behind_it():
    h = Harness(prefetch=1)
    h.register("w1", capacity=8)
    for i in range(16):  # a burst: the shell plans once after it
        rid = f"{'ab'[i // 8]}{i % 8}"
        h.take(h.engine.submit(("client", rid), submission(rid, count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))  # the first batch, 8 rows
    h.take(h.engine.plan(h.now))  # the next one, held by the worker behind it
    first, second = h.work
    assert len(first.slices) == len(second.slices) == 8
    h.answer(first, status="error", error_code="out_of_memory")  # an older worker: no rows said
    assert h.engine.workers["w1"].capacity == 7  # the batch that ran had 8 rows; the held one ran nothing
    h.run_all()
    assert all(h.reply(f"{x}{i}").status == "done" for x in "ab" for i in range(8))


def test_out_of_memory_of_one_row_running_alone_fails_that_group():
    h = Harness()
    h.register("w1", capacity=8)
    h.submit("g", count=1)
    h.answer(h.work[0], status="error", error_code="out_of_memory")
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == "out_of_memory"


# ---- the reducer's own time -------------------------------------------------------------------------------


def test_reducer_time_comes_from_the_injected_stopwatch_not_the_frozen_clock():
    from prometheus_client import CollectorRegistry

    from candidate_scheduler.service.metrics import SchedulerMetrics

    ticks = iter(float(i) * 0.25 for i in range(1000))
    h = Harness()
    h.engine = engine_module.Engine(h.engine.config, SchedulerMetrics(registry := CollectorRegistry()),
                                    stopwatch=lambda: next(ticks))
    h.register("w1")
    h.submit("g", count=2)
    h.answer(h.work[0])
    r = h.reply("g")
    assert r.metrics["reducer_s"] == pytest.approx(0.5)  # the fold and the finalize, 0.25 each
    assert registry.get_sample_value("candidate_scheduler_reducer_seconds_count") == 1
    assert registry.get_sample_value("candidate_scheduler_reducer_seconds_sum") == pytest.approx(0.5)


def test_a_late_answer_for_a_cancelled_slice_is_never_folded_into_a_new_group_with_its_id():
    # no kept replies: the id's reuse must run (as after a restart, or once its reply is no longer kept)
    h = Harness(batching="step", replies_kept=0)
    h.register("w1", capacity=8)
    h.submit("r", count=2, seed=1)
    old = h.work[0]
    h.take(h.engine.cancel("r", h.now)[1])
    assert h.reply("r").status == "cancelled"
    h.replies.clear()
    h.submit("r", count=2, seed=2)  # the client reuses the id; it joins the same worker's free rows
    new = h.work[-1]
    assert new.batch_id != old.batch_id and new.identity == old.identity
    assert new.slices[0].dispatch.seeds != old.slices[0].dispatch.seeds
    h.answer(old)  # the old slice finished before the cancel reached the worker: its answer comes late
    assert "r" not in h.replies  # not taken for the new group, whose slice 0 runs on that worker too
    h.answer(new)
    r = h.reply("r")
    assert r.status == "done" and tuple(r.candidate_seeds) == tuple(new.slices[0].dispatch.seeds)
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))


def test_a_guard_answers_an_exception_and_lets_an_interrupt_through():
    faults = []
    with Guard(lambda *fault: faults.append(fault), "result", ("g1",)):
        raise ValueError("boom")
    assert [(event, type(exc), ids) for event, exc, ids in faults] == [("result", ValueError, ("g1",))]
    with pytest.raises(KeyboardInterrupt), Guard(lambda *fault: faults.append(fault), "result", ()):
        raise KeyboardInterrupt
    assert len(faults) == 1  # an interrupt is not a fault to answer: the process is being stopped


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_out_of_memory_again_after_the_rows_were_lowered_is_a_new_incident(batching):
    """A worker that numbered its incidents by the steps it ran said the same step twice when two forwards
    failed in a row (a failed step runs no step): the second was taken for the first, the rows stayed, and
    the same slice was retried at the same size forever. Work sent after an incident is never part of it."""
    h = Harness(batching=batching)
    h.register("w1", capacity=8)
    h.submit("g", count=8, seed=3)
    for _ in range(60):  # the worker holds 2 rows; every incident says step 0
        live = [w for w in h.work if w.batch_id in h.engine.assignments]
        if not live:
            break
        for w in live:
            rows = sum(len(s.dispatch.candidate_ids) for s in w.slices)
            if rows > 2:
                h.answer(w, status="error", error_code="out_of_memory", report={"oom_rows": rows, "oom_step": 0})
            else:
                h.answer(w)
    r = h.reply("g")
    assert r.status == "done" and np.array_equal(r.action, reduced(r.candidate_seeds))
    assert h.engine.workers["w1"].capacity <= 3


@pytest.mark.parametrize("code", ["shutting_down", "deadline_unmeetable", "internal_error", "retries_exhausted",
                                  "forbidden", "Not A Code", "x" * 65])
def test_a_worker_cannot_answer_with_a_code_the_scheduler_owns(code):
    """A worker's `shutting_down` read as the scheduler's own (a resubmitting client waited for another run
    until it timed out) and its `deadline_unmeetable` turned the group `rejected`: the group fails as the
    model's error, the worker's code in its message."""
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)
    h.answer(h.work[0], status="error", error_code=code)
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == "model_error", r
    assert code[:64] in r.error


@pytest.mark.parametrize("code", ["bad_request", "model_error", "no_candidates", "unsupported_camera"])
def test_a_workers_own_code_reaches_the_client(code):
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)
    h.answer(h.work[0], status="error", error_code=code)
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == code and r.error == "boom"


def test_a_workers_error_message_of_megabytes_reaches_the_client_cut_short():
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)
    send = h.work[0]
    from candidate_scheduler.core.messages import WorkerResult

    huge = "x" * 5_000_000
    outputs = tuple(SliceOutcome(sw.dispatch.request_id, "error", error=huge, error_code="model_error")
                    for sw in send.slices)
    h.take(h.engine.worker_result(send.identity, WorkerResult("w1", send.batch_id, outputs, {}), h.now))
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == "model_error"
    assert len(r.error) < 5000 and "more characters" in r.error
