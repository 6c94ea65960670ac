"""The fluid forecast's sums over the fleet (core/fleet_terms.py), kept across decisions: always what a
fresh build gives, and after a change, recomputed for the workers that changed alone -- counted, not
timed. The change logs they follow (core/change_log.py) too."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from candidate_scheduler.core.change_log import ChangeLog
from candidate_scheduler.core.cost_model import CostModel
from candidate_scheduler.core.fleet_terms import FleetTerms
from candidate_scheduler.core.snapshot import RunningWork, WorkerView

LABELS = ("64x64", "256x256")


@dataclass(frozen=True)
class View:  # what FleetTerms reads of a core.snapshot.WorkerView
    worker_id: str
    rows: int
    running: bool
    busy_until: float
    conditions_aside: bool = False


def _fleet(rnd: random.Random, n: int) -> tuple[CostModel, list[View]]:
    cost = CostModel()
    views = []
    for i in range(n):
        wid = f"w{i}"
        for rows in (1, 4, 8):
            cost.observe_forward(wid, LABELS[0], rows, 0.01 * (1 + rows / 8) * rnd.uniform(0.8, 1.2))
        cost.observe_fixed(wid, LABELS[0], rnd.uniform(0.01, 0.05))
        views.append(View(wid, rnd.choice((4, 8)), rnd.random() < 0.7, 100.0 + rnd.uniform(0, 2), rnd.random() < 0.5))
    return cost, views


def _assert_same(kept: FleetTerms, workers: tuple, cost: CostModel, now: float) -> None:
    afresh = FleetTerms(workers, cost)
    for label in LABELS:  # the second label is borrowed from the first's line (never measured)
        assert kept.rate(label) == pytest.approx(afresh.rate(label), rel=1e-12)
        assert kept.overhead(label) == pytest.approx(afresh.overhead(label), rel=1e-12)
        assert kept.busy(label, now) == pytest.approx(afresh.busy(label, now), rel=1e-9, abs=1e-9)
        for size, cost_rows, busy in ((1, 1, False), (4, 3, True), (8, 8, True), (9, 9, False)):
            assert kept.best_run(label, size, cost_rows, 5, busy) == afresh.best_run(label, size, cost_rows, 5, busy)
            assert kept.periods(label, size, cost_rows, 5) == afresh.periods(label, size, cost_rows, 5)
    assert (kept.total_rows, kept.min_rows) == (afresh.total_rows, afresh.min_rows)


def test_kept_sums_are_the_sums_built_afresh_after_every_change():
    rnd = random.Random(11)
    cost, views = _fleet(rnd, 24)
    log: ChangeLog[int] = ChangeLog(keep=64)  # small: the log is trimmed during the run
    positions = {v.worker_id: i for i, v in enumerate(views)}
    terms, now, fresh_starts = FleetTerms((), cost), 100.0, 0
    log.restart()
    for _ in range(2500):
        i, roll = rnd.randrange(len(views)), rnd.random()
        wid = views[i].worker_id
        if roll < 0.35:  # it took or gave back work: a new predicted end, or none
            views[i] = View(wid, views[i].rows, rnd.random() < 0.8, now + rnd.uniform(-0.2, 2.0), views[i].conditions_aside)
            log.append(i)
        elif roll < 0.55:  # its cost model learnt from a result
            cost.observe_forward(wid, LABELS[0], rnd.choice((1, 4, 8)), rnd.uniform(0.005, 0.05))
        elif roll < 0.6:
            cost.observe_fixed(wid, LABELS[0], rnd.uniform(0.0, 0.1))
        elif roll < 0.62:  # its rows changed (0: told to run none): every position starts over
            views[i] = View(wid, (0, 4, 8)[rnd.randrange(3)], views[i].running, views[i].busy_until, views[i].conditions_aside)
            log.restart()
        elif roll < 0.7:  # a snapshot for another instant: earlier too (a test may ask so)
            now += rnd.uniform(-0.5, 0.1)
        else:
            now += rnd.uniform(0.0, 0.05)
        workers = tuple(views)
        before = terms
        terms = terms.follow(workers, log, positions)
        fresh_starts += terms is not before
        assert terms.workers is workers
        _assert_same(terms, workers, cost, now)
    assert 30 < fresh_starts < 100  # the row changes (about 50) start over; nothing else does


def test_after_one_worker_learnt_the_sums_read_that_worker_alone(monkeypatch):
    rnd = random.Random(3)
    cost, views = _fleet(rnd, 200)
    log: ChangeLog[int] = ChangeLog()
    log.restart()
    positions = {v.worker_id: i for i, v in enumerate(views)}
    workers = tuple(views)
    terms = FleetTerms((), cost).follow(workers, log, positions)
    for label in LABELS:
        terms.rate(label), terms.overhead(label), terms.busy(label, 100.5), terms.best_run(label, 4, 4, 5, True)
        terms.periods(label, 1, 1, 5)
    asked: list[str] = []
    forward_s, overhead_s = cost.forward_s, cost.overhead_s
    monkeypatch.setattr(cost, "forward_s", lambda wid, *a: asked.append(wid) or forward_s(wid, *a))
    monkeypatch.setattr(cost, "overhead_s", lambda wid, *a: asked.append(wid) or overhead_s(wid, *a))

    cost.observe_forward("w7", LABELS[0], 8, 0.5)  # a slow result on one worker
    views[9] = View("w9", views[9].rows, True, 101.0, views[9].conditions_aside)  # another took new work
    log.append(9)
    workers = tuple(views)
    assert terms.follow(workers, log, positions) is terms
    for label in LABELS:
        terms.rate(label), terms.overhead(label), terms.busy(label, 100.6), terms.best_run(label, 4, 4, 5, True)
        terms.periods(label, 1, 1, 5)
    assert asked and set(asked) <= {"w7", "w9", "w0"}  # w0: periods' first worker, read afresh each time
    _assert_same(terms, workers, cost, 100.6)


def test_an_infinitely_fast_worker_makes_the_rate_infinite_and_its_lesson_makes_it_finite_again():
    cost, log = CostModel(), ChangeLog()
    log.restart()
    cost.observe_forward("a", "L", 8, 0.0)  # a 0 s forward: a rate of inf, which a sum cannot take back
    cost.observe_forward("b", "L", 8, 0.02)
    workers = (View("a", 8, False, 0.0), View("b", 8, False, 0.0))
    terms = FleetTerms((), cost).follow(workers, log, {"a": 0, "b": 1})
    assert terms.rate("L") == math.inf
    for _ in range(80):
        cost.observe_forward("a", "L", 8, 0.02)
    terms = terms.follow(workers, log, {"a": 0, "b": 1})
    assert terms.rate("L") == pytest.approx(FleetTerms(workers, cost).rate("L")) and math.isfinite(terms.rate("L"))


def test_a_change_log_hands_each_reader_what_it_has_not_read_or_none_once_that_is_gone():
    log: ChangeLog[str] = ChangeLog(keep=3)
    assert log.since(0) == []
    for item in "abcde":
        log.append(item)
    assert log.since(2) == ["c", "d", "e"] and log.since(5) == []
    for item in "fgh":
        log.append(item)  # more than twice `keep`: the oldest are dropped
    assert log.since(0) is None and log.since(5) == ["f", "g", "h"]
    stamp = log.stamp
    log.restart()
    assert log.since(stamp) is None and log.since(log.stamp) == [] and log.since(log.stamp + 1) is None


def _work(rnd: random.Random, n: int, now: float) -> tuple[RunningWork, ...]:
    return tuple(RunningWork(rnd.randrange(10**6), (("g", 0),), rows, rows, 4, LABELS[0], ("k",), now,
                             ends_at=now + rnd.uniform(-0.05, 0.5))
                 for rows in (rnd.choice((1, 3, 4)) for _ in range(n)))


def test_kept_due_orders_are_the_orders_built_afresh_after_every_change():
    """The orders of late prefetch (FleetTerms.due: a batch due, spare rows due, each running end less
    the lead), on real planning views of 1 to 3 assignments, after every change of a random run."""
    rnd = random.Random(5)
    cost, _ = _fleet(rnd, 16)
    views = [WorkerView(f"w{i}", 8, rnd.random() < 0.5, _work(rnd, rnd.randrange(4), 100.0), prefetch=1)
             for i in range(16)]
    positions = {v.worker_id: i for i, v in enumerate(views)}
    log: ChangeLog[int] = ChangeLog()
    log.restart()
    terms, now = FleetTerms((), cost), 100.0

    def lead(w: WorkerView) -> float:
        return 0.01 + (w.rows * cost.overhead_s(w.worker_id, LABELS[0]) if w.conditions_aside else 0.0)

    for _ in range(1500):
        i = rnd.randrange(len(views))
        if rnd.random() < 0.6:
            views[i] = WorkerView(views[i].worker_id, 8, views[i].conditions_aside, _work(rnd, rnd.randrange(4), now),
                                  prefetch=1)
            log.append(i)
        else:
            cost.observe_fixed(views[i].worker_id, LABELS[0], rnd.uniform(0.0, 0.05))  # the lead moves with it
        now += rnd.uniform(0.0, 0.02)
        workers = tuple(views)
        terms = terms.follow(workers, log, positions)
        afresh = FleetTerms(workers, cost)
        for kind in ("batch", "rows", "ends"):
            assert terms.due(kind, lead).order == afresh.due(kind, lead).order, kind
        assert terms.due("ends", lead).order == sorted(
            (a.ends_at - lead(w), i) for i, w in enumerate(workers) if w.spare for a in w.running)
        assert terms.due("batch", lead).order == sorted(
            (w.busy_until - lead(w) if w.running else -math.inf, i) for i, w in enumerate(workers) if w.takes_a_batch)
    assert any(len(v.running) > 1 for v in views)


def test_a_term_that_was_most_of_a_kept_sum_leaves_the_others_sum_when_it_changes():
    """Kept sums are mended by taking a worker's old term out. When that term dwarfed the rest, the rest
    was lost to rounding (the fleet's rate went to the changed worker's alone); it is summed afresh."""
    from candidate_scheduler.core import fleet_terms
    terms = [1e301] + [1.0] * 20
    kept = fleet_terms._Sum(lambda i: terms[i], len(terms), 0)
    terms[0] = 2.0
    kept.update(0)
    assert kept.value == 22.0
    terms[5] = math.inf  # the infinite terms are still counted apart
    kept.update(5)
    terms[5] = 3.0
    kept.update(5)
    assert kept.value == 24.0
