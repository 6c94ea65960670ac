"""A load point whose verdict is known stops the work it sent (bench/load_point.py), so the next point
starts on an idle arm without waiting out a backlog: a real scheduler and a slow null worker."""

from __future__ import annotations

import collections
import time

import numpy as np

from candidate_scheduler.bench.load_arms import Arm
from candidate_scheduler.bench.load_point import Planned, run_point
from candidate_scheduler.service.client import make_request

IMAGE = np.full((16, 16, 3), 9, dtype=np.uint8)
STEP_S = 0.5  # a group of 4 steps takes 2 s on the one worker, which runs one row at a time


def _planned(tag: str, n: int) -> list[Planned]:
    return [Planned(0.01 * i, 1, make_request(IMAGE, "pick", count=1, seed=i, steps=4, request_id=f"{tag}{i}"))
            for i in range(n)]


def test_a_point_past_its_verdict_cancels_what_it_sent_and_leaves_the_arm_idle(services):
    sched = services.scheduler()
    services.worker(sched, capacity=1, step_delay=STEP_S)
    sched.wait_workers(1)
    arm = Arm("dispatch", endpoint=sched.request, control=sched.control)
    t0 = time.monotonic()
    # 6 groups sent within 0.05 s; over a 0.3 s SLO two of them decide the p99, well before the first is done
    run = run_point(arm.endpoint, 100.0, _planned("p", 6), 0.3, early_stop=True, cancel=arm.cancel)
    waited = time.monotonic() - t0
    statuses = collections.Counter(o.status for o in run.outcomes)
    assert run.stopped_early and run.cancelled == 6, (run.cancelled, statuses)
    assert statuses == {"cancelled": 6}, statuses  # every group sent answered once, none lost
    assert waited < 6 * 4 * STEP_S / 2, waited  # not the 12 s of draining them one after another
    with sched.client() as c:
        assert c.stats()["queued_groups"] == 0
        assert c.submit(IMAGE, "pick", count=1, steps=1, seed=3, timeout_s=30).status == "done"


def test_without_cancel_the_point_waits_for_what_it_sent(services):
    sched = services.scheduler()
    services.worker(sched, capacity=1, step_delay=0.05)
    sched.wait_workers(1)
    run = run_point(sched.request, 100.0, _planned("w", 3), 0.05, early_stop=True)
    assert run.cancelled == 0 and {o.status for o in run.outcomes} == {"done"}


def test_a_cancel_that_fails_leaves_the_point_waiting_for_what_it_sent(services):
    sched = services.scheduler()
    services.worker(sched, capacity=1, step_delay=0.05)
    sched.wait_workers(1)

    def unreachable(_ids):
        raise TimeoutError("no control reply to CANCEL")

    run = run_point(sched.request, 100.0, _planned("f", 3), 0.05, early_stop=True, cancel=unreachable)
    assert run.stopped_early and run.cancelled == 0
    assert {o.status for o in run.outcomes} == {"done"}  # waited for, none lost
