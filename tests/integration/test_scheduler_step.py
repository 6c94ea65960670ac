"""Step-level batching, deadlines, elastic counts and out-of-memory re-planning through the real service
(scheduler and null-worker processes on real sockets; `--step-delay` makes every denoise step take a
known time, which the worker's warm-up profile measures like a real model's)."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.core import rng
from candidate_scheduler.service.client import make_request
from tests.conftest import wait_for
from tests.integration.test_scheduler import IMAGE, expected_candidates


def test_step_mode_a_short_group_joins_and_leaves_a_long_one(services):
    sched = services.scheduler("--batching", "step")
    services.worker(sched, "null", 8, 0.02)
    sched.wait_workers(1)
    with sched.client() as c:
        long_id = c.send(make_request(IMAGE, "pick", count=4, seed=1, steps=150, return_candidates=True))
        short = c.submit(IMAGE, "pick", count=2, seed=2, steps=4, return_candidates=True, timeout_s=10)
        assert c.status(long_id).state == "running"  # answered while the long group still runs
        long = c.wait(long_id, timeout_s=30)
    assert short.status == "done" and short.metrics["joined_running_batches"] == 1
    np.testing.assert_array_equal(short.candidates, expected_candidates(2, 2))
    np.testing.assert_array_equal(long.candidates, expected_candidates(1, 4, steps=150))
    assert short.metrics["first_step_s"] < 1.0


def test_dispatch_mode_a_short_group_waits_for_the_long_one(services):
    sched = services.scheduler("--batching", "dispatch")
    services.worker(sched, "null", 8, 0.02)
    sched.wait_workers(1)
    with sched.client() as c:
        long_id = c.send(make_request(IMAGE, "pick", count=4, seed=1, steps=60))
        short = c.submit(IMAGE, "pick", count=2, seed=2, steps=4, timeout_s=30)
        assert c.status(long_id).state == "done"  # the short group could only start once the long one ended
    assert short.status == "done" and short.metrics["joined_running_batches"] == 0


def test_out_of_memory_re_plans_smaller_slices_with_the_same_result(services):
    sched = services.scheduler()
    services.worker(sched, "null", 8, 0.0, "--fault", "oom_rows=3")
    sched.wait_workers(1)
    with sched.client() as c:
        r = c.submit(IMAGE, "pick", count=8, seed=5, return_candidates=True, timeout_s=20)
        again = c.submit(IMAGE, "pick", count=8, seed=6, return_candidates=True, timeout_s=20)
    assert r.status == "done", r.error
    np.testing.assert_array_equal(r.candidates, expected_candidates(5, 8))
    assert r.metrics["microbatches"] >= 3  # 8 -> 4 + 4 -> 2 + 2 + 2 + 2 (each <= 3 rows)
    # the worker's capacity was lowered: the next group is admitted in slices that fit at once
    assert again.status == "done" and again.metrics["retries"] == 0


def test_deadlines_refuse_what_cannot_be_met_and_serve_elastic_counts(services):
    sched = services.scheduler("--batching", "step")
    services.worker(sched, "null", 8, 0.05)
    sched.wait_workers(1)
    with sched.client() as c:
        busy = c.send(make_request(IMAGE, "pick", count=6, seed=1, steps=60))  # ~3 s of 6 rows
        # on its worker before the deadline groups arrive: a queued best-effort group would be overtaken
        # (deadlines go first) and the elastic group would get all 8 rows
        wait_for(lambda: c.status(busy).state == "running", 10, "the 6-row group to start")
        refused = c.submit(IMAGE, "pick", count=8, seed=2, steps=10, deadline_s=0.5, timeout_s=5)
        elastic = c.submit(IMAGE, "pick", count=8, min_count=2, seed=3, steps=10, deadline_s=2.0,
                           return_candidates=True, timeout_s=10)
        bad = c.submit(IMAGE, "pick", count=4, min_count=5, timeout_s=5)
        never = c.submit(IMAGE, "pick", count=4, deadline_s=-1.0, timeout_s=5)
        assert c.wait(busy, timeout_s=30).status == "done"
    assert refused.status == "rejected" and refused.error_code == "deadline_unmeetable"
    assert "predicted completion" in refused.error
    assert elastic.status == "done" and elastic.served_count == 2 and elastic.metrics["served_count"] == 2
    seeds = rng.candidate_seeds(3, 8, "per_candidate")
    assert elastic.candidate_seeds == list(seeds[:2])
    np.testing.assert_array_equal(elastic.candidates, expected_candidates(3, 8, steps=10)[:2])
    assert bad.status == "invalid" and bad.metrics["error_field"] == "min_count"
    assert never.status == "invalid" and never.metrics["error_field"] == "deadline_s"
