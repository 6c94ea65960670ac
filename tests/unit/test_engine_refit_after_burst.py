"""Slices admitted in a burst (the shell submits with plan=False and plans once after the burst) are still
halved when the worker they were sized for goes before any planning pass saw them, and a smaller one
takes its place: none waits forever for rows that will not come (Engine._fit_slices)."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.core.messages import Leaving, Left
from tests.unit.test_engine import Harness, reduced, submission


@pytest.mark.parametrize("batching", ["dispatch", "step"])
@pytest.mark.parametrize("how", ["leaving", "operator"])
def test_a_burst_admitted_for_a_worker_that_went_runs_on_a_smaller_one(batching, how):
    h = Harness(batching=batching)
    h.register("big", capacity=8)  # nothing queued yet: no planning pass has fitted anything
    # a burst: the group is admitted (one slice of 8, for the only worker) and the worker goes in it
    h.take(h.engine.submit(("client", "g"), submission("g", count=8, seed=7), h.now, plan=False))
    assert [len(ids) for ids in h.engine.groups["g"].slices] == [8]
    if how == "leaving":  # its SIGTERM: a rolling update
        h.take(h.engine.worker_leaving(b"big", Leaving("big", 30.0), h.now, plan=False))
        h.take(h.engine.worker_left(b"big", Left("big", "finished"), h.now, plan=False))
    else:  # an operator's `worker leave`
        h.take(h.engine.worker_leave("big", h.now)[1])
    h.take(h.engine.plan(h.now))  # the burst's one pass: no live worker
    assert not h.engine.workers and not h.work
    h.register("small", capacity=4)  # the fleet's largest is 4 rows now
    assert h.work, "the 8-row slice waits forever for a worker that can hold 8 rows"
    assert all(len(s.dispatch.candidate_ids) <= 4 for w in h.work for s in w.slices)
    h.run_all()
    r = h.reply("g")
    assert r.status == "done" and len(r.candidate_seeds) == 8
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))
