"""The fluid forecast (core/fluid.py): deadline questions on a large fleet answered with the fleet as one
pipe, never by simulating every start and end. Here the exact simulation is made to raise, so every
answer below is the pipe's."""

from __future__ import annotations

import heapq

import pytest

from candidate_scheduler.core import deadlines, fluid
from tests.unit.test_engine import Harness, submission
from tests.unit.test_engine_deadlines import LABEL, calibrated

WORKERS = 20  # x 8 rows = 160 rows: past fluid.EXACT_LIMIT on its own
STEP_S = 0.05 + 0.01 * 8  # a forward of 8 rows (the calibrated profile)
RUN_S = 10 * STEP_S  # a group of 10 steps at a full forward


@pytest.fixture
def fleet(monkeypatch):
    def exact(*args, **kwargs):
        raise AssertionError("the exact simulation ran on a fleet the pipe answers for")

    monkeypatch.setattr(deadlines, "forecast", exact)
    h = Harness(batching="step", max_queued_groups=10_000)
    for i in range(WORKERS):
        calibrated(h, f"w{i}")
    assert WORKERS * 8 > fluid.EXACT_LIMIT
    return h


def burst(h: Harness, n: int, **kw) -> None:
    for i in range(n):
        h.take(h.engine.submit(("client", f"g{i}"), submission(f"g{i}", count=1, seed=i, steps=10, **kw), h.now,
                               plan=False))
    h.take(h.engine.plan(h.now))


def test_a_burst_of_deadline_groups_is_admitted_as_far_as_the_fleet_can_run_it_in_time(fleet):
    burst(fleet, 800, deadline_s=3.0)
    refused = [rid for rid, r in fleet.replies.items() if r[0].error_code == "deadline_unmeetable"]
    admitted = 800 - len(refused)
    # 160 rows run a 10-step one-candidate group in RUN_S (1.3 s): about two rounds fit in 3 s
    rounds = 3.0 / RUN_S
    assert 160 * (rounds - 1) <= admitted <= 160 * (rounds + 1), admitted
    # what is refused is the tail: the pipe's wait only grows along the burst
    assert set(refused) == {f"g{i}" for i in range(admitted, 800)}
    fleet.run_all()
    assert all(fleet.reply(f"g{i}").status == "done" for i in range(admitted))


def test_a_group_ahead_by_its_deadline_is_admitted_whatever_waits_behind_it(fleet):
    burst(fleet, 2000)  # best effort: due 30 s after receipt
    fleet.submit("urgent", count=8, steps=10, deadline_s=2 * RUN_S + 0.5)
    assert "urgent" not in fleet.replies  # ahead of all 2,000: it waits only for rows running now
    fleet.submit("hopeless", count=8, steps=10, deadline_s=0.5 * RUN_S)
    r = fleet.reply("hopeless")
    assert r.status == "rejected" and r.error_code == "deadline_unmeetable"


def test_an_elastic_group_on_a_busy_fleet_is_served_the_count_the_pipe_has_time_for(fleet):
    burst(fleet, 320)  # every row busy for one group's run, and as many groups queued behind
    # ahead of the queued ones by its deadline: it waits for the running rows, then runs at a full forward
    fleet.submit("elastic", count=8, steps=10, deadline_s=2 * RUN_S + 0.3, candidates_min=1)
    fleet.run_all()
    r = fleet.reply("elastic")
    assert r.status == "done" and r.metrics["served_count"] == 8


def test_the_pipe_answers_afresh_once_the_cost_model_has_learned_something(fleet):
    burst(fleet, 320)  # every row busy for one group's run, and as many groups queued behind
    fleet.submit("before", count=1, steps=10, deadline_s=3.5 * RUN_S)
    assert "before" not in fleet.replies  # about three runs: the running one, the queued one, its own
    for i in range(WORKERS):  # every worker's forwards turn out 4x slower than its warm-up said
        for _ in range(60):
            fleet.engine.cost.observe_forward(f"w{i}", LABEL, 8, 4 * STEP_S)
    fleet.submit("after", count=1, steps=10, deadline_s=3.5 * RUN_S)
    r = fleet.reply("after")  # the pipe's fleet rates were kept between submissions; not past a lesson
    assert r.status == "rejected" and r.error_code == "deadline_unmeetable"




def test_what_runs_now_drains_as_each_worker_predicts_at_any_instant(fleet):
    """busy_s, from sums kept between snapshots (core/fleet_terms.py), is the rate-weighted sum of each
    running worker's remaining time, before, at, between and after their predicted ends."""
    for i in range(WORKERS):  # one group of 8 rows per worker, each with another step count: other ends
        fleet.take(fleet.engine.submit(("client", f"s{i}"), submission(f"s{i}", count=8, seed=i, steps=2 + i),
                                       fleet.now, plan=False))
    fleet.take(fleet.engine.plan(fleet.now))
    ends = sorted(w.busy_until for w in fleet.engine.snapshot(fleet.now).workers if w.running)
    assert len(set(ends)) == WORKERS
    kept = fleet.engine.snapshot(fleet.now).workers
    for now in [fleet.now, *ends, *(e + 1e-3 for e in ends), (ends[0] + ends[-1]) / 2, ends[-1] + 1.0]:
        snap = fleet.engine.snapshot(now)
        assert snap.workers is kept  # nothing changed: the sums are reused, only the instant moves
        pipe = fluid.Pipe(snap)
        rates = [w.rows / snap.cost.forward_s(w.worker_id, LABEL, w.rows) for w in snap.workers]
        # the row-steps left drain at the rate the fleet is planned to run: each worker's over its margin
        planned = sum(r / snap.cost.margin(w.worker_id) for w, r in zip(snap.workers, rates))
        direct = sum(r * max(0.0, w.busy_until - now) for w, r in zip(snap.workers, rates) if w.running)
        assert pipe.busy_s(LABEL) == pytest.approx(direct / planned, rel=1e-9, abs=1e-12)
    assert fluid.Pipe(fleet.engine.snapshot(ends[-1])).busy_s(LABEL) == 0.0


def test_a_deadline_group_is_admitted_when_the_elastic_groups_ahead_of_it_could_shrink_to_make_room(fleet):
    # 160 groups of 8: 8 rounds of the fleet's rows at their counts, one at their minimum (at their counts,
    # not even they would all be admitted)
    for i in range(160):
        fleet.take(fleet.engine.submit(("client", f"e{i}"), submission(f"e{i}", count=8, seed=i, steps=10,
                                       deadline_s=2.5 * RUN_S, candidates_min=1), fleet.now, plan=False))
    assert not fleet.replies and len(fleet.engine.elastic) == 160
    fleet.take(fleet.engine.submit(("client", "room"), submission("room", count=1, seed=0, steps=10,
                                   deadline_s=3 * RUN_S), fleet.now, plan=False))
    assert "room" not in fleet.replies  # behind them all: in time only once they give back their excess


def _run_in_time(h: Harness, steps: int, step_s) -> dict[str, float]:
    """Dispatch batching in simulated time: each worker runs its batches one after another, a batch of r rows
    taking steps x step_s(r) seconds; the engine hears of each at its end. request id -> reply time."""
    free: dict[bytes, float] = {}
    ends: list = []
    sent = 0
    answered: dict[str, float] = {}
    while True:
        for send in h.work[sent:]:
            rows = sum(len(sw.dispatch.candidate_ids) for sw in send.slices)
            start = max(h.now, free.get(send.identity, h.now))
            free[send.identity] = start + steps * step_s(rows)
            heapq.heappush(ends, (free[send.identity], send.batch_id, send))
        sent = len(h.work)
        for rid in h.replies:
            answered.setdefault(rid, h.now)
        if not ends:
            return answered
        end, _bid, send = heapq.heappop(ends)
        h.now = max(h.now, end)
        if send.batch_id in h.engine.assignments:
            h.answer(send)
        h.take(h.engine.tick(h.now))


def test_elastic_counts_at_the_head_of_a_burst_leave_room_for_its_tail_beyond_the_watch_window(monkeypatch):
    monkeypatch.setattr(deadlines, "forecast", lambda *a, **k: (_ for _ in ()).throw(AssertionError("exact ran")))
    h = Harness(batching="dispatch", max_queued_groups=10_000)
    for i in range(WORKERS):
        calibrated(h, f"w{i}")
    # 200 groups of 8 that may shrink to 2, one deadline: 10 rounds of the fleet's rows at their counts,
    # 2.5 at their minimum, 4 rounds' time: in time only if most are shed -- including by the first
    # groups to start, whose watch window (deadlines.WATCH_WINDOW slices) sees a third of the burst
    assert 200 > 3 * deadlines.WATCH_WINDOW
    deadline = 4 * RUN_S + 0.3
    for i in range(200):
        h.take(h.engine.submit(("client", f"e{i}"), submission(f"e{i}", count=8, seed=i, steps=10,
                               deadline_s=deadline, candidates_min=2), h.now, plan=False))
    assert not h.replies  # every one admitted: at their minimum they all fit
    start = h.now
    h.take(h.engine.plan(h.now))
    answered = _run_in_time(h, 10, lambda rows: 0.05 + 0.01 * rows)
    replies = {rid: r[0] for rid, r in h.replies.items()}
    assert len(replies) == 200
    late = [rid for rid, r in replies.items() if r.status != "done" or answered[rid] > start + deadline]
    assert not late, (len(late), sorted(late)[:5])
    served = [r.metrics["served_count"] for r in replies.values()]
    assert min(served) >= 2 and 200 * 2 < sum(served) < 200 * 8  # shed, not below the minimum, nor all of it


def test_an_elastic_burst_keeps_its_promises_when_the_fleet_runs_slower_than_its_warm_up_said(monkeypatch):
    """The same burst, but every batch takes 15% longer than the workers' warm-up profile: the margin is
    learned from the burst's own first results, after the head's counts are fixed. The groups behind are
    planned with fluid.TAIL_RESERVE in hand, so the tail still sheds in time (with no reserve, 19 of the
    200 expire here)."""
    monkeypatch.setattr(deadlines, "forecast", lambda *a, **k: (_ for _ in ()).throw(AssertionError("exact ran")))
    h = Harness(batching="dispatch", max_queued_groups=10_000)
    for i in range(WORKERS):
        calibrated(h, f"w{i}")
    deadline = 4 * RUN_S + 0.3
    for i in range(200):
        h.take(h.engine.submit(("client", f"e{i}"), submission(f"e{i}", count=8, seed=i, steps=10,
                               deadline_s=deadline, candidates_min=2), h.now, plan=False))
    assert not h.replies
    start = h.now
    h.take(h.engine.plan(h.now))
    answered = _run_in_time(h, 10, lambda rows: 1.15 * (0.05 + 0.01 * rows))
    replies = {rid: r[0] for rid, r in h.replies.items()}
    late = [rid for rid, r in replies.items() if r.status != "done" or answered[rid] > start + deadline]
    assert len(replies) == 200 and not late, (len(late), sorted(late)[:5])
    served = [r.metrics["served_count"] for r in replies.values()]
    assert min(served) >= 2 and 200 * 2 < sum(served) < 200 * 8
