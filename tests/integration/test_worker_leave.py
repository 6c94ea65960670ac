"""A worker told to go (SIGTERM) leaves gracefully, with real processes on real sockets (null workers):
it takes no new work, finishes what it holds, and the scheduler forgets it the moment it goes -- no
slice runs twice and nothing waits out a heartbeat timeout. Past its grace period it goes anyway and
what it held is retried at once (worker/leaving.py, core/worker_link.py "Leaving")."""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np

from candidate_scheduler.service.client import make_request
from tests.conftest import wait_for
from tests.integration.test_scheduler import IMAGE, assert_single_reply, expected_candidates

LEFT = re.compile(r": left \((\w+)\)")


def both_mid_denoise(c) -> bool:
    workers = c.stats()["workers"].values()
    return len(workers) == 2 and all(w["step"] is not None and w["step"] >= 1 for w in workers)


def test_sigterm_mid_group_finishes_the_workers_slice_and_nothing_runs_twice(services):
    sched = services.scheduler()
    leaver = services.worker(sched, "null", 4, 0.2)
    services.worker(sched, "null", 4, 0.2)
    sched.wait_workers(2)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=8, seed=77, return_candidates=True, steps=6))
        wait_for(lambda: both_mid_denoise(c), 10, "both workers mid-denoise")
        os.kill(leaver.pid, signal.SIGTERM)
        wait_for(lambda: list(c.stats()["leaving"]) and len(c.stats()["workers"]) == 1, 5, "the worker leaving")
        r = c.wait(rid, timeout_s=30)
        assert r.status == "done", r.error
        assert r.metrics["retries"] == 0  # its slice was finished where it ran, not run again
        np.testing.assert_array_equal(r.candidates, expected_candidates(77, 8, steps=6))
        assert leaver.proc.wait(timeout=10) == 0
        assert leaver.wait_line(LEFT, 1).group(1) == "finished"
        stats = c.stats()  # forgotten at once: no heartbeat timeout to wait out
        assert not stats["leaving"] and len(stats["workers"]) == 1
        # a group sent now runs on the worker that stayed
        again = c.submit(IMAGE, "pick", count=4, seed=5, return_candidates=True, request_id="after")
        assert again.status == "done" and again.metrics["retries"] == 0
        assert_single_reply(c, rid)


def test_past_its_grace_a_leaving_worker_goes_and_its_slice_is_retried_at_once(services):
    sched = services.scheduler()
    leaver = services.worker(sched, "null", 4, 0.3, "--leave-grace-s", "0.2")
    services.worker(sched, "null", 4, 0.3)
    sched.wait_workers(2)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=8, seed=21, return_candidates=True, steps=8))
        wait_for(lambda: both_mid_denoise(c), 10, "both workers mid-denoise")
        signalled = time.monotonic()
        os.kill(leaver.pid, signal.SIGTERM)
        assert leaver.proc.wait(timeout=10) == 0
        gone_s = time.monotonic() - signalled
        assert leaver.wait_line(LEFT, 1).group(1) == "grace_expired"
        stats = c.stats()
        assert not stats["leaving"] and len(stats["workers"]) == 1
        # gone within its grace plus a step and the wind-down, well inside the 3 s heartbeat timeout it
        # would otherwise have taken to notice
        assert gone_s < 2.0, gone_s
        r = c.wait(rid, timeout_s=30)
        assert r.status == "done", r.error
        assert r.metrics["retries"] == 1
        np.testing.assert_array_equal(r.candidates, expected_candidates(21, 8, steps=8))
        assert_single_reply(c, rid)


def test_with_no_scheduler_to_answer_an_idle_worker_still_goes_promptly(services):
    sched = services.scheduler()
    w = services.worker(sched, "null", 4)
    sched.wait_workers(1)
    sched.proc.kill()
    signalled = time.monotonic()
    os.kill(w.pid, signal.SIGTERM)
    assert w.proc.wait(timeout=10) == 0
    assert time.monotonic() - signalled < 5.0  # the ack timeout, not the 25 s grace
    assert w.wait_line(LEFT, 1).group(1) == "no_ack"


def test_the_replacement_benchmark_runs_its_graceful_arm_exactly():
    from candidate_scheduler.bench.worker_leave import report, run_arm

    run = run_arm("sigterm", workers=2, groups=8, count=2, steps=4, step_s=0.05, signal_at_s=0.3)
    assert run["exact"] and run["statuses"] == ["done"] and run["retries"] == 0
    assert run["worker_exit"] == 0 and run["worker_listed_s"] is not None
    assert "| sigterm |" in report([run])
