"""A fault half-way through a step that changes several things at once (core/engine.py, "atomic events"):
the group it concerns is answered once, and nothing is left behind that strands other groups. Each case
was found by planting the fault, and each left a group unanswered, or the engine stuck, before:

- a reply that could not be built (the group ended with no reply to hand out, and was forgotten);
- a planning pass's first check (it escaped the event, with the replies the event had made);
- forgetting an ended group (a step skipped left it queued: every later pass raised on it);
- losing a worker (its groups stayed running on a worker that was gone);
- a registration (the worker was kept, but the groups waiting for one were never admitted);
- a submission kept but not yet recorded (in flight, in no queue, never answered);
- a refusal whose metric raised (no answer)."""

from __future__ import annotations

import pytest

from candidate_scheduler.core import reducers
from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.messages import AckRegistration, InternalFault, Registration, Reply
from candidate_scheduler.core.pending import PendingIndex
from candidate_scheduler.core.tenants import Tenants
from tests.unit.test_engine import Harness, capability


def _raises(message: str):
    def fault(*_args, **_kwargs):
        raise RuntimeError(f"injected: {message}")
    return fault


def _faults(out: list) -> list[InternalFault]:
    return [m for m in out if isinstance(m, InternalFault)]


def _settled(h: Harness, *worker_ids: str, rounds: int = 5) -> None:
    """Time passes with the workers beating and the assignments out answered (a few rounds, not until none
    is left: an assignment stranded on a lost worker would never go)."""
    for _ in range(rounds):
        h.advance(1.0)
        for w in worker_ids:
            h.beat(w)
        h.take(h.engine.tick(h.now))
        for w in [w for w in h.work if w.batch_id in h.engine.assignments]:
            h.answer(w)


def test_a_reply_that_cannot_be_built_still_answers_its_group_once(monkeypatch):
    h = Harness()
    h.register("w1")
    h.submit("g", count=2, seed=3)  # the harness asks for its candidates back
    real, calls = reducers.PartialReduction.candidates, []

    def candidates(self):  # the reduction's stack works; the reply's copy of it runs out of memory
        calls.append(1)
        if len(calls) >= 2:
            raise MemoryError("injected")
        return real(self)

    monkeypatch.setattr(reducers.PartialReduction, "candidates", candidates)
    out = h.answer(h.work[0])
    r = h.reply("g")
    assert (r.status, r.error_code) == ("failed", "internal_error") and "MemoryError" in r.error
    assert [f.request_ids for f in _faults(out)] == [("g",)]
    assert "g" not in h.engine.groups and h.engine.status("g").state == "failed"
    monkeypatch.undo()
    h.submit("next", count=2, seed=4)
    h.run_all()
    assert h.reply("next").status == "done"


@pytest.mark.parametrize("check", ["views.any_open", "views.current", "fleet_rows.current"])
def test_a_fault_in_the_planning_passs_first_check_keeps_the_events_replies(monkeypatch, check):
    h = Harness()
    h.register("w1", capacity=2)
    h.submit("busy", count=2)
    h.submit("victim", count=2)  # queued behind busy
    h.submit("other", count=2)  # keeps the queue non-empty after the cancel
    owner, name = check.split(".")
    monkeypatch.setattr(getattr(h.engine, owner), name, _raises(check))
    answer, out = h.engine.cancel("victim", h.now)  # the cancel, then a planning pass whose check raises
    h.take(out)
    assert answer.ok and answer.changed
    assert [r.status for r in h.replies["victim"]] == ["cancelled"] and _faults(out)
    monkeypatch.undo()
    h.run_all()
    assert h.reply("busy").status == "done" and h.reply("other").status == "done"


def test_a_step_of_forgetting_a_group_that_raises_leaves_nothing_behind(monkeypatch):
    h = Harness()
    h.register("w1", capacity=2)
    h.submit("busy", count=2)
    h.submit("victim", count=2)  # queued
    real, calls = PendingIndex.discard_group, []

    def once(self, rid):
        calls.append(rid)
        if len(calls) == 1:
            raise RuntimeError("injected: discard_group")
        return real(self, rid)

    monkeypatch.setattr(PendingIndex, "discard_group", once)
    answer, out = h.engine.cancel("victim", h.now)
    h.take(out)
    assert [r.status for r in h.replies["victim"]] == ["cancelled"]
    # the tenant's count and the owners went with it, though a step before them raised
    assert dict(h.engine.tenants.in_flight) == {"default": 1} and "victim" not in h.engine.tenants.owners
    # the group's queue entry did not outlive it: later groups are planned and answered
    h.run_all()
    for i in range(3):
        h.submit(f"new{i}", count=1)
    h.run_all()
    assert all(h.reply(f"new{i}").status == "done" for i in range(3)) and h.reply("busy").status == "done"
    assert "victim" not in h.engine.pending and not h.engine.groups


@pytest.mark.parametrize("fault", ["cost.forget", "rows_changed", "link.drop"])
def test_a_fault_while_losing_a_worker_still_retries_what_it_held(monkeypatch, fault):
    h = Harness()
    h.register("w1")
    h.register("w2")
    h.submit("g", count=2)
    lost = h.work[0].identity.decode()
    alive = "w2" if lost == "w1" else "w1"
    owner, name = fault.split(".") if "." in fault else (None, fault)
    monkeypatch.setattr(getattr(h.engine, owner) if owner else h.engine, name, _raises(fault))
    h.advance(h.engine.config.heartbeat_timeout_s + 1)
    h.beat(alive)
    out = h.take(h.engine.tick(h.now))  # `lost` stops beating: presumed dead
    assert _faults(out) and lost not in h.engine.workers
    monkeypatch.undo()
    _settled(h, alive)
    r = h.reply("g")
    assert r.status == "done" and not h.engine.assignments and not h.engine.groups


def test_a_registration_that_faults_after_keeping_the_worker_still_admits_the_groups_waiting(monkeypatch):
    h = Harness()
    h.submit("early", count=2)  # no worker yet: it waits for one
    monkeypatch.setattr(CostModel, "observe_forward", _raises("observe_forward"))
    out = h.take(h.engine.register(b"w1", Registration("w1", capability(), 8, profile=(("64x64h16f5", 2, 0.1),)),
                                   h.now))
    monkeypatch.undo()
    assert _faults(out) and any(isinstance(m, AckRegistration) for m in out)  # the worker hears it is in
    h.submit("late", count=2)
    _settled(h, "w1")
    assert h.reply("early").status == "done" and h.reply("late").status == "done" and not h.engine.waiting


def test_a_fault_between_keeping_a_submission_and_recording_it_answers_it(monkeypatch):
    h = Harness()
    h.register("w1")
    monkeypatch.setattr(Tenants, "kept", _raises("Tenants.kept"))
    out = h.submit("g", count=2)
    monkeypatch.undo()
    r = h.reply("g")
    assert (r.status, r.error_code) == ("failed", "internal_error") and [f.request_ids for f in _faults(out)] == [("g",)]
    assert "g" not in h.engine.groups and h.engine.stats()["groups_in_flight"] == 0
    h.submit("g", count=2)  # the id is free again: the group runs
    h.run_all()
    assert [x.status for x in h.replies["g"]] == ["failed", "done"]


def test_a_refusal_whose_metric_raises_is_still_answered(monkeypatch):
    h = Harness()
    monkeypatch.setattr(h.engine.metrics, "group_completed", _raises("group_completed"), raising=False)
    out = h.engine.refuse(("client", "x"), "x", "invalid", "bad_array", "cannot decode images", tenant="default")
    [reply] = [m for m in out if isinstance(m, Reply)]
    assert (reply.result.status, reply.result.error_code) == ("invalid", "bad_array")
    assert [f.request_ids for f in _faults(out)] == [("x",)] and h.engine.counters["internal_errors"] == 1
