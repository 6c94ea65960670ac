"""The workers' planning views kept between snapshots (core/worker_views.py): always what a fresh build
of every view gives, and rebuilt only for the workers that changed -- counted, not timed."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.bench.fleet_engine import LABEL, FakeFleet, _capability
from candidate_scheduler.bench.fleet_sim import ClockedFleet
from candidate_scheduler.core.fleet_terms import FleetTerms
from candidate_scheduler.core.messages import Heartbeat, Registration
from candidate_scheduler.core.snapshot import WorkerView


def _fresh(engine) -> tuple[WorkerView, ...]:
    engine.fleet_rows.current(engine.workers)  # every worker's rows up to date
    return tuple(WorkerView.of(w, w.rows, engine.config.prefetch) for w in engine.workers.values())


def test_kept_views_are_the_views_built_afresh_after_every_event():
    rnd = np.random.default_rng(5)
    for batching in ("dispatch", "step"):
        fleet = FakeFleet(batching, 6, 8, deadline_every=2, counts=(1, 3, 8), min_count=1)
        engine = fleet.engine
        fleet.submit(80)
        for i in range(300):
            if i % 7 == 0:  # the clock moves: predicted ends are measured against it
                fleet.now += 0.05
            if i == 100:  # a worker goes silent and is declared dead: its work goes back to the queue
                engine.link.lost(engine.workers["w2"], "heartbeat timeout", "tick")
                for bid in [b for b, s in fleet.outstanding.items() if s.identity == b"w2"]:
                    del fleet.outstanding[bid]
            if i == 150:  # a new one registers, and an old one registers again (a restart)
                for wid in ("w9", "w4"):
                    fleet.take(engine.register(wid.encode(), Registration(wid, _capability(8), 8), fleet.now))
                for bid in [b for b, s in fleet.outstanding.items() if s.identity == b"w4"]:
                    del fleet.outstanding[bid]  # the restarted worker's old assignments are lost with it
            if i % 11 == 0:
                held = tuple(b for b, s in fleet.outstanding.items() if s.identity == b"w1")
                fleet.take(engine.heartbeat(b"w1", Heartbeat("w1", held), fleet.now))
            if rnd.random() < 0.6 and fleet.outstanding:
                fleet.answer_oldest()
            else:
                fleet.submit(int(rnd.integers(1, 4)))
            snap, fresh = engine.snapshot(fleet.now), _fresh(engine)
            assert snap.workers == fresh, (batching, i)
            assert snap.open == tuple(w for w in fresh if w.open_to_work(batching == "dispatch")), (batching, i)
            assert [w.worker_id for w in snap.open] == [
                wid for wid, w in engine.workers.items() if w.open_to_work(engine.config.prefetch, batching == "dispatch")]
            assert all(snap.worker(w.worker_id) is w for w in snap.workers)
            kept, afresh = snap.terms, FleetTerms(snap.workers, engine.cost)  # the fluid sums, mended as they go
            assert kept is engine.fleet and kept.workers is snap.workers
            assert kept.rate(LABEL) == pytest.approx(afresh.rate(LABEL), rel=1e-12)
            assert kept.busy(LABEL, fleet.now) == pytest.approx(afresh.busy(LABEL, fleet.now), rel=1e-9, abs=1e-12)
            assert kept.best_run(LABEL, 8, 8, 4, True) == afresh.best_run(LABEL, 8, 8, 4, True)
        assert fleet.answered > 100


def test_a_burst_of_submissions_rebuilds_no_view_and_keeps_one_tuple(monkeypatch):
    """A deadline submission takes a snapshot for its refusal check; with the workers unchanged between
    two of them, none is rebuilt whatever the fleet's size, and they share one tuple of views (which
    the fluid model keeps its per-fleet sums by). Under load, a pass looks at the open workers alone."""
    built = 0
    of = WorkerView.of.__func__

    def counted(cls, *args, **kwargs):
        nonlocal built
        built += 1
        return of(cls, *args, **kwargs)

    monkeypatch.setattr(WorkerView, "of", classmethod(counted))
    for workers in (8, 128):
        fleet = FakeFleet("dispatch", workers, 8, deadline_every=1)
        fleet.submit(workers * 16)  # every worker busy, as much again waiting
        first = fleet.engine.snapshot(fleet.now)
        assert first.open == ()  # every worker holds a batch and the next: none may be sent one
        built = 0
        fleet.submit(50)
        assert built == 0, (workers, built)
        assert fleet.engine.snapshot(fleet.now).workers is first.workers
        fleet.answer_oldest()  # one worker's result: its view alone is rebuilt, and it was sent the next
        assert 1 <= built <= 2, (workers, built)


def _later(snap, w) -> float | None:
    """When a pass may next place work on `w`, as a scan of every open worker asks (core/snapshot.py)."""
    if snap.batching == "dispatch":
        return snap.prefetch_due_at(w)
    lead = snap.lead_s(w)
    return min((a.ends_at - lead for a in w.running if a.ends_at - lead > snap.now), default=None) if w.spare else None


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_workers_due_for_late_prefetch_are_the_ones_a_scan_of_the_open_workers_finds(batching):
    """Under the defaults (late prefetch; staggered starts under dispatch batching) on a simulated clock:
    the order of the open workers by when work for them is due (core/fleet_terms.py), mended as they
    change, answers what a scan of every open worker answers -- who is due now (with the spare rows due,
    under step batching), when the next one is -- after every event."""
    fleet = ClockedFleet(batching, 6, 8, steps=20, step_s=0.15)
    fleet.submit(10 * 6 * 8, plan=False)  # deep enough to stagger the starts
    fleet.plan()
    checked = 0
    while checked < 300 and fleet.step():
        snap = fleet.engine.snapshot(fleet.now)
        if batching == "dispatch":
            assert snap.due_now() == [w for w in snap.open if snap.prefetch_due(w)]
        else:
            scan = [(w, snap.spare_due(w) if w.spare else 0) for w in snap.open]
            assert snap.rows_due() == [(w, spare) for w, spare in scan if w.free_rows + spare > 0]
        later = [t for w in snap.open for t in (_later(snap, w),) if t is not None and t > snap.now]
        assert snap.wake_at() == min(later, default=None)
        checked += 1
    assert checked == 300 and fleet.answered > 300
    assert (fleet.engine.counters["staggered_starts"] > 0) == (batching == "dispatch")
