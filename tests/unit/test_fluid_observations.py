"""The fluid forecast (core/fluid.py) for groups of several observations: a slice's forward carries its
candidates x observations rows, more than the worker's candidate rows when it is full. The pipe must
never time such a slice shorter than its own run alone, or an elastic count is chosen that the workers
cannot finish in time."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.core import deadlines, fluid
from candidate_scheduler.core.forecast import forecast
from tests.unit.test_engine import Harness, submission
from tests.unit.test_engine_deadlines import calibrated

WORKERS = 20  # x 8 rows: past fluid.EXACT_LIMIT, so the pipe answers
TWO_OBSERVATIONS = np.full((2, 16, 16, 3), 7, dtype=np.uint8)


def _fleet() -> Harness:
    h = Harness(batching="step", max_queued_groups=10_000)
    for i in range(WORKERS):
        calibrated(h, f"w{i}")  # a forward of r rows: 0.05 + 0.01 r seconds
    assert WORKERS * 8 > fluid.EXACT_LIMIT
    return h


def _submit(h: Harness, rid: str, count: int, deadline_s: float, candidates_min: int) -> None:
    h.take(h.engine.submit(("client", rid), submission(rid, count=count, seed=1, steps=10, deadline_s=deadline_s,
                                                       candidates_min=candidates_min, images=TWO_OBSERVATIONS,
                                                       batched=True), h.now, plan=False))


def test_the_pipe_never_times_a_slice_of_several_observations_shorter_than_its_own_run():
    h = _fleet()
    _submit(h, "e", count=16, deadline_s=30.0, candidates_min=4)
    snap = h.engine.snapshot(h.now)
    view = snap.group("e")
    pipe = fluid.Pipe.of(snap)
    for n in range(view.min_count, view.served_count + 1):
        units = view.units(n, snap.slice_capacity)
        # on an idle fleet every slice runs on a worker of its own: the group ends with its longest slice
        alone = max(pipe.run_s(u, busy=False) for u in units)
        assert pipe.finish(units, 0.0) - snap.now >= alone - 1e-9, n


def test_an_elastic_group_of_two_observations_is_served_a_count_its_workers_finish_in_time():
    h = _fleet()
    # 16 candidates x 2 observations: two slices of 8 candidates, 16 rows a forward each, 10 steps of
    # 0.21 s = 2.1 s on two idle workers; at its minimum (4 x 2 rows) 1.3 s
    _submit(h, "e", count=16, deadline_s=1.8, candidates_min=4)
    assert not h.replies  # in time at its minimum
    snap = h.engine.snapshot(h.now)
    view = snap.group("e")
    n = deadlines.choose_count(snap, view)
    exact = forecast(snap.now, snap.sim_workers(), view.units(n, snap.slice_capacity), snap.planned_cost, "step")
    assert exact["e"] <= view.deadline, (n, exact["e"] - snap.now)
    h.take(h.engine.plan(h.now))
    sent = [a for a in h.engine.assignments.values()]
    assert sent and all(a.sent_at + a.predicted_s <= view.deadline for a in sent), \
        [(len(a.entries), a.predicted_s) for a in sent]
