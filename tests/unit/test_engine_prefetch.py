"""Prefetch (EngineConfig.prefetch): a worker may be sent work beyond what it can start, which waits on
the worker and starts at its first step boundary with room (worker/running.py) instead of a round trip
later. It is used only when no worker can start the work now."""

from __future__ import annotations

import math

import pytest

from tests.unit.test_engine import Harness, submission


def test_dispatch_sends_a_busy_worker_its_next_batch_after_every_idle_one_has_work():
    h = Harness(prefetch=1)
    h.register("w1", capacity=4)
    h.submit("g1", count=4)  # w1 runs it
    h.register("w2", capacity=4)
    h.submit("g2", count=4)  # w2 is idle: it goes there, not behind g1
    assert [(w.identity, w.slices[0].dispatch.request_id) for w in h.work] == [(b"w1", "g1"), (b"w2", "g2")]
    h.submit("g3", count=4)
    h.submit("g4", count=4)
    h.submit("g5", count=4)  # each worker holds one running and one next: g5 waits at the scheduler
    assert [(w.identity, w.slices[0].dispatch.request_id, w.join) for w in h.work[2:]] == [
        (b"w1", "g3", False), (b"w2", "g4", False)]  # a BATCH: it runs after the current one, on its own
    h.answer(h.work[0])
    assert (h.work[-1].identity, h.work[-1].slices[0].dispatch.request_id) == (b"w1", "g5")
    h.run_all()
    assert all(h.reply(f"g{i}").status == "done" for i in range(1, 6))


def test_step_holds_up_to_one_batch_of_rows_beyond_capacity_and_only_when_nothing_is_free():
    h = Harness(batching="step", prefetch=1)
    h.register("w1", capacity=4)
    h.submit("a", count=3, steps=8)
    h.register("w2", capacity=4)
    h.submit("b", count=2, steps=8)  # w2 has 4 free rows, w1 one: best fit among what runs now is w2
    h.submit("c", count=1, steps=8)  # w1's last free row
    assert [(w.identity, w.slices[0].dispatch.request_id) for w in h.work] == [(b"w1", "a"), (b"w2", "b"),
                                                                               (b"w1", "c")]
    h.submit("d", count=2, steps=8)  # w2's free rows first
    h.submit("e", count=4, steps=8)  # nothing free: held by a worker, to start when rows free there
    h.submit("f", count=4, steps=8)
    h.submit("g", count=4, steps=8)  # 2 x 4 rows each is all they may hold: g waits at the scheduler
    placed = {w.slices[0].dispatch.request_id: w for w in h.work}
    assert placed["d"].identity == b"w2" and placed["e"].join and placed["f"].join and "g" not in placed
    assert {placed["e"].identity, placed["f"].identity} == {b"w1", b"w2"}
    for w in h.engine.workers.values():
        assert w.rows_in_use <= 2 * 4
    h.run_all()
    assert all(h.reply(r).status == "done" for r in "abcdefg")


def test_no_prefetch_sends_only_what_can_start():
    h = Harness(prefetch=0)
    h.register("w1", capacity=4)
    h.submit("g1", count=4)
    h.submit("g2", count=4)
    assert len(h.work) == 1


def test_a_burst_placed_in_one_pass_never_hands_a_worker_more_rows_than_it_runs_in_one_assignment():
    h = Harness(batching="step", prefetch=1)
    h.register("w1", capacity=8)
    for i in range(20):  # the shell plans once after a burst of submissions
        h.take(h.engine.submit(("client", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert [(sum(len(s.dispatch.candidate_ids) for s in w.slices), w.join) for w in h.work] == [(8, False), (8, True)]
    h.run_all()
    assert all(h.reply(f"g{i}").status == "done" for i in range(20))


def test_spare_rows_never_take_a_slice_larger_than_the_worker_runs():
    # a worker whose rows shrank (out of memory, a memory cap) after a slice was sized for a larger one
    from candidate_scheduler.core.planning import Unit, WorkerSlot

    shrunk = WorkerSlot("w", capacity=4, free_rows=4, forward_key=None, spare=4)
    wide = Unit("g", 0, tuple(range(6)), ("bk",), ("fk",))
    assert not shrunk.accepts(wide)  # 4 + 4 rows to hold, but it runs 4 at once: it would run out again
    assert shrunk.accepts(Unit("h", 0, tuple(range(4)), ("bk",), ("fk",)))


def test_a_worker_told_fewer_rows_gets_them_in_every_assignment():
    h = Harness(batching="step", prefetch=1)
    h.register("w1", capacity=8)
    h.engine.workers["w1"].capacity = 5  # as an out-of-memory incident leaves it
    h.engine.rows_changed()
    h.submit("g", count=2)
    assert h.work[-1].rows == 5


# ---- late prefetch (EngineConfig.prefetch_lead_s, PlanningSnapshot.prefetch_due_at) -----------------------

def _calibrated(h: Harness, worker_id: str, conditioning: str = "inline", fixed_cost: float = 0.0) -> None:
    """A worker whose warm-up profile says a forward of r rows takes 0.05 + 0.01 r seconds."""
    from candidate_scheduler.core.messages import Registration
    from tests.unit.test_engine import capability

    profile = tuple((LABEL, r, 0.05 + 0.01 * r) for r in (1, 4, 8)) + ((LABEL, 0, fixed_cost),)
    h.take(h.engine.register(worker_id.encode(), Registration(worker_id, capability(), 8, conditioning=conditioning,
                                                              profile=profile), h.now))


LABEL = "64x64h16f5"  # SamplingSpec().forward_label()


def _send(h: Harness, rid: str, tenant: str) -> None:
    from candidate_scheduler.core.access import Principal, Role

    who = Principal(tenant, tenant, Role.CLIENT)
    h.take(h.engine.submit(("c", rid), submission(rid, count=1), h.now, principal=who))


def _rows(work) -> int:
    return sum(len(s.dispatch.candidate_ids) for s in work.slices)


def _batch_of(h: Harness, rid: str) -> int:
    return next(i for i, w in enumerate(h.work) if any(s.dispatch.request_id == rid for s in w.slices))


@pytest.mark.parametrize("lead", [0.01, math.inf])
def test_dispatch_sends_the_next_batch_just_in_time_so_a_group_arriving_meanwhile_goes_in_it(lead):
    h = Harness(prefetch=1, prefetch_lead_s=lead)
    _calibrated(h, "w1")
    for i in range(40):  # a flood of one tenant's one-candidate groups
        _send(h, f"rl{i}", "rl")
    running = h.engine.assignments[h.work[0].batch_id]
    end = running.sent_at + running.predicted_s
    if lead == math.inf:  # at once: the next batch of the flood is held on the worker from the start
        assert len(h.work) == 2 and h.engine.wake_at is None
    else:
        assert len(h.work) == 1 and h.engine.wake_at == pytest.approx(end - lead)
    h.advance(running.predicted_s / 2)
    _send(h, "robot", "robots")  # another tenant's group, halfway through the running batch
    if lead != math.inf:
        assert len(h.work) == 1  # the worker is not due yet: the robot waits at the scheduler, first in line
        h.now = h.engine.wake_at  # the shell runs a pass at the engine's wake_at (service/server.py)
        h.take(h.engine.plan(h.now))
        assert len(h.work) == 2 and not h.work[1].join  # a BATCH, run after the current one
        assert h.engine.wake_at is None  # it holds all it may until a result comes
    h.advance(running.predicted_s / 2)
    h.answer(h.work[0])
    h.run_all()
    # just in time, the robot's group goes in the batch after the running one; at once, one batch later
    assert _batch_of(h, "robot") == (1 if lead != math.inf else 2)
    assert h.reply("robot").status == "done" and all(h.reply(f"rl{i}").status == "done" for i in range(40))


def test_after_a_result_the_worker_is_due_again_a_lead_before_its_next_batch_ends():
    h = Harness(prefetch=1, prefetch_lead_s=0.02)
    _calibrated(h, "w1")
    for i in range(24):
        _send(h, f"rl{i}", "rl")
    h.now = h.engine.wake_at
    h.take(h.engine.plan(h.now))
    first, second = (h.engine.assignments[w.batch_id] for w in h.work)
    # predicted to start when the first ends (in 0.02 s), then 4 forwards of 8 rows
    assert second.sent_at + second.predicted_s == pytest.approx(first.sent_at + first.predicted_s + 4 * 0.13)
    h.advance(0.02)
    h.answer(h.work[0])  # the held batch runs now: the third is due 0.02 s before it ends
    assert h.engine.wake_at == pytest.approx(second.sent_at + second.predicted_s - 0.02)


def test_step_holds_spare_rows_until_rows_are_about_to_free():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=0.01)
    _calibrated(h, "w1")
    for i in range(20):  # a burst the shell plans once
        h.take(h.engine.submit(("client", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert [(_rows(w), w.join) for w in h.work] == [(8, False)]  # its free rows now; nothing held yet
    running = h.engine.assignments[h.work[0].batch_id]
    assert h.engine.wake_at == pytest.approx(running.sent_at + running.predicted_s - 0.01)
    h.now = h.engine.wake_at
    h.take(h.engine.plan(h.now))
    assert [(_rows(w), w.join) for w in h.work] == [(8, False), (8, True)]  # joins when the rows free
    h.run_all()
    assert all(h.reply(f"g{i}").status == "done" for i in range(20))


def test_the_lead_covers_conditioning_on_a_worker_that_conditions_aside():
    h = Harness(prefetch=1, prefetch_lead_s=0.01)
    _calibrated(h, "w1", conditioning="thread", fixed_cost=0.3)  # conditioning a group: 0.3 s
    for i in range(24):
        _send(h, f"rl{i}", "rl")
    snap = h.engine.snapshot(h.now)
    [view] = snap.workers
    assert snap.lead_s(view) == pytest.approx(0.01 + 8 * 0.3)  # every row may be another observation
    assert len(h.work) == 2 and h.engine.wake_at is None  # longer than the batch: the next is sent at once


def test_prefetch_is_due_at_once_without_a_prediction_and_an_idle_worker_takes_work_at_once():
    h = Harness(prefetch=1, prefetch_lead_s=0.01)
    h.register("w1")  # no warm-up profile: no prediction to time a prefetch by
    for i in range(24):
        _send(h, f"rl{i}", "rl")
    assert len(h.work) == 2 and h.engine.wake_at is None
    h2 = Harness(prefetch=1, prefetch_lead_s=0.01)
    _calibrated(h2, "w1")
    snap = h2.engine.snapshot(h2.now)
    assert snap.prefetch_due_at(snap.workers[0]) == -math.inf  # idle: its first batch is no prefetch


@pytest.mark.parametrize("bad", [-0.1, "0.01", float("nan")])
def test_a_bad_lead_is_refused(bad):
    with pytest.raises(ValueError, match="prefetch_lead_s"):
        Harness(prefetch_lead_s=bad)


def test_stats_say_how_work_is_prefetched():
    assert Harness(prefetch=1, prefetch_lead_s=0.01).engine.stats()["prefetch"] == {"batches": 1, "lead_s": 0.01}
    assert Harness(prefetch=2, prefetch_lead_s=math.inf).engine.stats()["prefetch"] == {"batches": 2, "lead_s": None}


# ---- predicted ends (Assignment.ends_at): late prefetch is timed by them --------------------------------

RUN_S = 4 * (0.05 + 0.01 * 8)  # a full batch of `_calibrated`: 4 steps of 8 rows


def _burst(h: Harness, n: int) -> None:
    """n one-candidate groups, then planning passes (as the shell runs after a burst): every batch full."""
    for i in range(n):
        h.take(h.engine.submit(("c", f"rl{i}"), submission(f"rl{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))  # a pass places one batch on a worker: the one it runs
    h.take(h.engine.plan(h.now))  # and the next: the one it holds


def test_a_held_batch_on_a_worker_that_conditions_aside_is_conditioned_while_it_waits():
    h = Harness(prefetch=1, prefetch_lead_s=math.inf)  # at once: the next batch goes out with the first
    _calibrated(h, "w1", conditioning="thread", fixed_cost=0.001)  # conditioning a group: 1 ms
    _burst(h, 24)
    first, held = (h.engine.assignments[w.batch_id] for w in h.work[:2])
    assert first.predicted_s == pytest.approx(8 * 0.001 + RUN_S)  # an idle worker conditions, then runs
    assert held.run_s == pytest.approx(RUN_S)
    # its 8 ms of conditioning overlap the first batch: counted again, every held batch's predicted end
    # would drift 8 ms later than the real one, and late prefetch would send each next batch late
    assert held.ends_at == pytest.approx(first.ends_at + RUN_S)


def test_when_a_batch_ends_the_one_held_next_is_predicted_from_then():
    h = Harness(prefetch=1, prefetch_lead_s=math.inf)
    _calibrated(h, "w1")
    _burst(h, 24)
    first, held = (h.engine.assignments[w.batch_id] for w in h.work[:2])
    h.now = first.ends_at - 0.1  # the batch ends 0.1 s sooner than predicted
    h.answer(h.work[0])
    assert held.ends_at == pytest.approx(h.now + RUN_S)  # it started now, not when the first was predicted to end
    third = h.engine.assignments[h.work[2].batch_id]  # sent at once, to run after it
    assert third.ends_at == pytest.approx(h.now + 2 * RUN_S)


def test_under_step_batching_held_rows_that_join_when_rows_free_are_predicted_from_then():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    _calibrated(h, "w1")
    _burst(h, 16)  # 8 rows run, 8 more wait on the worker for them
    first, held = (h.engine.assignments[w.batch_id] for w in h.work[:2])
    assert held.join and held.ends_at == pytest.approx(first.ends_at + held.run_s)
    h.now = first.ends_at - 0.1  # the first rows free 0.1 s sooner than predicted
    h.answer(h.work[0])
    assert held.ends_at == pytest.approx(h.now + held.run_s)  # they joined now


# ---- the margin a worker shows it needs (core/prefetch.py) --------------------------------------------

@pytest.mark.parametrize(("margin", "starved", "lead", "expected"), [
    (0.0, True, 0.01, 0.01),  # the first starved result: the configured lead again, on top of it
    (0.01, True, 0.01, 0.02),  # then it doubles
    (0.0, True, 0.0, 0.005),  # a zero lead still learns
    (50.0, True, 0.01, 60.0),  # capped: everything goes at once
    (0.02, False, 0.01, 0.02 * 0.98),  # a result with work held, or nothing queued: it shrinks
    (0.0, False, 0.01, 0.0),
])
def test_a_starved_result_doubles_the_margin_and_any_other_shrinks_it(margin, starved, lead, expected):
    from candidate_scheduler.core.prefetch import next_margin

    assert next_margin(margin, starved, lead) == pytest.approx(expected)


def _flooded(groups: int = 40) -> tuple[Harness, object]:
    """One calibrated worker under late prefetch, `groups` queued; the harness and its first assignment."""
    h = Harness(prefetch=1, prefetch_lead_s=0.01)
    _calibrated(h, "w1")
    for i in range(groups):
        _send(h, f"rl{i}", "rl")
    return h, h.engine.assignments[h.work[0].batch_id]


def test_a_worker_left_with_nothing_to_run_gets_its_next_work_earlier():
    h, first = _flooded()
    lead_before = h.engine.snapshot(h.now)
    assert lead_before.lead_s(lead_before.workers[0]) == pytest.approx(0.01)
    # the batch ends earlier than predicted, before the worker was due: it holds nothing next
    h.advance(first.predicted_s / 2)
    h.answer(h.work[0])
    assert h.engine.prefetch_margin["w1"] == pytest.approx(0.01)
    snap = h.engine.snapshot(h.now)
    assert snap.lead_s(snap.workers[0]) == pytest.approx(0.02)  # its next batch goes out 20 ms ahead
    # the idle worker took the next batch at once; when its prefetch comes in time, the margin shrinks
    h.now = h.engine.wake_at
    h.take(h.engine.plan(h.now))
    h.advance(0.02)
    h.answer(h.work[1])  # the held batch runs on: not starved
    assert h.engine.prefetch_margin["w1"] == pytest.approx(0.01 * 0.98)
    h.run_all()
    assert all(h.reply(f"rl{i}").status == "done" for i in range(40))


def test_a_lost_worker_takes_its_margin_out_of_the_gauge():
    h, first = _flooded()
    h.advance(first.predicted_s / 2)
    gauge = []
    h.engine.metrics = type("Gauge", (), {"prefetch_margin": lambda _self, s: gauge.append(s),
                                          "__getattr__": lambda _self, _name: lambda *a, **k: None})()
    h.answer(h.work[0])  # starved: a margin of its own
    assert gauge[-1] == pytest.approx(0.01)
    h.advance(h.engine.config.heartbeat_timeout_s + 1.0)
    h.take(h.engine.tick(h.now))  # silent past the heartbeat timeout: lost
    assert "w1" not in h.engine.workers and gauge[-1] == 0.0


def test_step_sends_only_as_many_spare_rows_as_are_about_to_free():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=0.01)
    _calibrated(h, "w1")
    h.submit("short", count=4, steps=4)
    h.submit("long", count=4, steps=40)  # the worker's 8 rows: one ends soon, the other ten times later
    for i in range(8):
        h.submit(f"next{i}", count=1, steps=4)
    assert len(h.work) == 2  # nothing held yet
    short, long_ = (h.engine.assignments[w.batch_id] for w in h.work)
    assert h.engine.wake_at == pytest.approx(short.sent_at + short.predicted_s - 0.01)
    h.now = h.engine.wake_at
    h.take(h.engine.plan(h.now))
    assert sum(_rows(w) for w in h.work[2:]) == 4  # the 4 rows `short` frees, not all 8 it may hold
    assert h.engine.wake_at == pytest.approx(long_.sent_at + long_.predicted_s - 0.01)
    h.run_all()
    assert all(h.reply(r).status == "done" for r in ["short", "long", *(f"next{i}" for i in range(8))])


def test_a_pass_with_no_worker_due_places_nothing_and_forecasts_no_count(monkeypatch):
    from candidate_scheduler.core import deadlines

    h = Harness(prefetch=1, prefetch_lead_s=0.01)
    _calibrated(h, "w1")
    for i in range(16):
        _send(h, f"rl{i}", "rl")
    h.take(h.engine.submit(("c", "elastic"), submission("elastic", count=8, candidates_min=2, deadline_s=20.0),
                           h.now))
    assert "elastic" in h.engine.elastic
    counted = []
    real = deadlines.choose_count
    monkeypatch.setattr(deadlines, "choose_count", lambda snap, view: counted.append(view.request_id) or real(snap, view))
    assert not h.engine.schedule(h.now) and not counted  # not due: no placement, and no forecast either
    h.now = h.engine.wake_at
    assert h.engine.schedule(h.now) and counted == ["elastic"]


def test_the_queue_says_whether_a_worker_could_take_any_of_it():
    from candidate_scheduler.core.pending import PendingIndex
    from candidate_scheduler.core.planning import Unit, step_class

    index = PendingIndex(step_class)
    index.add(Unit("g", 0, (0, 1, 2, 3), ("bk",), ("64x64",), (1.0, 0, 0)))
    assert index.could_join(None, 4) and index.could_join(("64x64",), 8)
    assert not index.could_join(("64x64",), 3)  # too large for the free rows
    assert not index.could_join(("128x128",), 8)  # another forward: it cannot join that batch


def test_a_workers_view_reuses_each_assignments_view_until_its_predicted_end_moves():
    from candidate_scheduler.core.microbatch import BatchEntry
    from candidate_scheduler.core.snapshot import WorkerView
    from candidate_scheduler.core.workers import Assignment

    a = Assignment(7, "w1", (BatchEntry("g", 0, (0, 1)),), ("k",), sent_at=10.0, label="L", predicted_s=0.5, steps=4)
    worker = type("W", (), {"worker_id": "w1", "conditions_aside": False, "assignments": {7: a}, "refused_labels": frozenset()})()
    first = WorkerView.of(worker, 8, 1).running[0]
    assert first.ends_at == 10.5 and first.keys == (("g", 0),) and first.rows == 2
    assert WorkerView.of(worker, 8, 1).running[0] is first  # nothing moved: the same view
    a.ends_at = 10.2  # re-anchored (WorkerLink.reanchor): what a plan reads must move with it
    again = WorkerView.of(worker, 8, 1)
    assert again.running[0] is not first and again.running[0].ends_at == 10.2 and again.busy_until == 10.2
