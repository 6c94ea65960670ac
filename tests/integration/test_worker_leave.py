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
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.bench.scrape import scrape
from candidate_scheduler.bench.worker_leave import WORKER_LINE, report, run_arm
from candidate_scheduler.service.client import make_request
from tests.conftest import wait_for
from tests.integration.played_scheduler import PlayedScheduler
from tests.integration.test_scheduler import IMAGE, assert_single_reply, expected_candidates

LEFT = re.compile(r": left \((\w+)\)")
BEFORE_TIMEOUT_S = 1.0  # the tests' scheduler declares a silent worker dead after 1.5 s (conftest)


def counted(sched) -> dict[str, float]:
    """The scheduler's departures and failures of workers, by outcome or kind (nonzero ones)."""
    return {k.split("{", 1)[1].rstrip("}"): v for k, v in scrape(sched.metrics).items()
            if v and k.startswith(("candidate_scheduler_worker_departures_total{",
                                   "candidate_scheduler_worker_failures_total{"))}


def both_mid_denoise(c) -> bool:
    workers = c.stats()["workers"].values()
    return len(workers) == 2 and all(w["step"] is not None and w["step"] >= 1 for w in workers)


def gone(c) -> bool:
    stats = c.stats()
    return not stats["leaving"] and len(stats["workers"]) == 1


def fleet_of_two(services, step_s: float, *extra: str):
    """A scheduler with metrics and two null workers of 4 rows (the first started with `extra`)."""
    sched = services.scheduler(metrics=True)
    first = services.worker(sched, "null", 4, step_s, *extra)
    services.worker(sched, "null", 4, step_s)
    sched.wait_workers(2)
    return sched, first


def group_on_both(c, seed: int, steps: int) -> str:
    """A group of 8 candidates, a slice on each worker, both mid-denoise."""
    rid = c.send(make_request(IMAGE, "pick", count=8, seed=seed, return_candidates=True, steps=steps))
    wait_for(lambda: both_mid_denoise(c), 10, "both workers mid-denoise")
    return rid


def answered_exactly(c, rid: str, seed: int, steps: int, retries: int) -> None:
    r = c.wait(rid, timeout_s=30)
    assert r.status == "done", r.error
    assert r.metrics["retries"] == retries
    np.testing.assert_array_equal(r.candidates, expected_candidates(seed, 8, steps=steps))
    assert_single_reply(c, rid)


def test_sigterm_mid_group_finishes_the_workers_slice_and_nothing_runs_twice(services):
    sched, leaver = fleet_of_two(services, 0.2)
    with sched.client() as c:
        rid = group_on_both(c, seed=77, steps=6)
        os.kill(leaver.pid, signal.SIGTERM)
        answered_exactly(c, rid, 77, 6, retries=0)  # its slice was finished where it ran, not run again
        assert leaver.proc.wait(timeout=10) == 0
        assert leaver.wait_line(LEFT, 1).group(1) == "finished"
        wait_for(lambda: gone(c), BEFORE_TIMEOUT_S, "the worker forgotten before any heartbeat timeout")
        assert counted(sched) == {'outcome="finished"': 1.0}
        # a group sent now runs on the worker that stayed
        again = c.submit(IMAGE, "pick", count=4, seed=5, return_candidates=True, request_id="after")
        assert again.status == "done" and again.metrics["retries"] == 0


def test_past_its_grace_a_leaving_worker_goes_and_its_slice_is_retried_at_once(services):
    sched, leaver = fleet_of_two(services, 0.3, "--leave-grace-s", "0.2")
    with sched.client() as c:
        rid = group_on_both(c, seed=21, steps=8)
        os.kill(leaver.pid, signal.SIGTERM)
        assert leaver.proc.wait(timeout=10) == 0
        assert leaver.wait_line(LEFT, 1).group(1) == "grace_expired"
        wait_for(lambda: gone(c), BEFORE_TIMEOUT_S, "the worker forgotten before any heartbeat timeout")
        assert counted(sched) == {'outcome="unfinished"': 1.0, 'kind="left_unfinished"': 1.0}
        answered_exactly(c, rid, 21, 8, retries=1)


def test_an_operator_asks_a_worker_to_leave_and_it_finishes_first(services):
    sched, _first = fleet_of_two(services, 0.2)
    with sched.client() as c:
        rid = group_on_both(c, seed=41, steps=6)
        wid = next(iter(c.stats()["workers"]))
        reply = c.worker_leave(wid)
        assert reply.ok and reply.changed and reply.state == "leaving" and reply.detail == {"assignments": 1}
        assert wid in c.stats()["leaving"]
        answered_exactly(c, rid, 41, 6, retries=0)
        (leaver,) = [w for w in sched.workers if w.wait_line(WORKER_LINE, 1).group(1) == wid]
        assert leaver.proc.wait(timeout=10) == 0 and leaver.wait_line(LEFT, 1).group(1) == "finished"
        wait_for(lambda: gone(c), BEFORE_TIMEOUT_S, "the worker forgotten before any heartbeat timeout")
        assert counted(sched) == {'outcome="finished"': 1.0}
        assert not c.worker_leave("nobody").ok


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


def test_work_prefetched_to_a_leaving_worker_is_given_back_and_runs_elsewhere_at_once(services):
    """A worker holds a long group (10 s) and the next one, sent ahead (`--prefetch-lead inf`). On SIGTERM
    it gives the next one back: it runs on the other worker while the long one finishes, instead of after."""
    sched = services.scheduler("--prefetch-lead", "inf", metrics=True)
    leaver = services.worker(sched, "null", 4, 0.05)
    sched.wait_workers(1)
    with sched.client() as c:
        long = c.send(make_request(IMAGE, "pick", count=4, seed=1, steps=200, return_candidates=True))  # 10 s
        nxt = c.send(make_request(IMAGE, "pick", count=4, seed=2, steps=4, return_candidates=True))
        wait_for(lambda: c.status(long).state == "running" and c.status(nxt).state == "running", 10,
                 "the long group running and the next one sent ahead to the same worker")
        services.worker(sched, "null", 4, 0.05)
        sched.wait_workers(2)
        assert c.status(long).state == "running", "the long group ended before the test could signal"
        os.kill(leaver.pid, signal.SIGTERM)
        r = c.wait(nxt, timeout_s=30)
        assert c.status(long).state == "running", "the next group waited for the long one"
        assert r.status == "done" and r.metrics["retries"] == 0  # given back unstarted: not a retry
        np.testing.assert_array_equal(r.candidates, expected_candidates(2, 4, steps=4))
        first = c.wait(long, timeout_s=30)
        assert first.status == "done" and first.metrics["retries"] == 0
        np.testing.assert_array_equal(first.candidates, expected_candidates(1, 4, steps=200))
        assert leaver.proc.wait(timeout=10) == 0 and leaver.wait_line(LEFT, 1).group(1) == "finished"
    scraped = scrape(sched.metrics)
    retried = {k: v for k, v in scraped.items() if v and k.startswith("candidate_scheduler_retries_total{")}
    assert retried == {} and scraped["candidate_scheduler_slices_given_back_total"] == 1.0


# ---- the worker's side against a scheduler the test plays (one ROUTER socket, in process) ----------------


@pytest.fixture
def played():
    p = PlayedScheduler()
    yield p
    p.close()


@pytest.mark.parametrize("takes_give_back", [True, False])
def test_a_batch_crossing_leaving_is_given_back_and_an_id_lost_on_the_link_is_not_waited_for(played, takes_give_back):
    """False: a scheduler of the release before GIVE_BACK (its LEAVE_ACK does not say it takes it): the
    worker runs what it holds, as then, rather than hand it to a scheduler that would drop it."""
    played.batch(1, steps=40)  # 2 s: still running when batch 2 and the ack arrive
    played.holding(1)
    played.worker.leave()
    _i, _k, leaving = played.next({protocol.Kind.LEAVING})
    assert leaving.worker_id == "w" and leaving.grace_s == 30.0
    played.batch(2, steps=4)  # sent before the scheduler read LEAVING: a BATCH waits for the running one
    asked = time.monotonic()
    played.send(protocol.Kind.LEAVE_ACK, protocol.LeaveAckMsg([1, 2, 99], give_back=takes_give_back))  # 99: lost
    _i, _k, left = played.next({protocol.Kind.LEFT})
    if takes_give_back:  # 1 was running: answered; 2 had not started: handed back to run elsewhere
        assert played.results == {1} and played.given_back == {2} and left.reason == "finished"
    else:
        assert played.results == {1, 2} and played.given_back == set() and left.reason == "finished"
    assert time.monotonic() - asked < 8.0  # not its 30 s grace, waiting for 99
    played.gone(5)
    assert played.worker.left_reason == "finished"


def test_unanswered_leaving_is_asked_again_and_a_busy_worker_keeps_at_it_until_its_grace():
    p = PlayedScheduler()
    try:
        p.batch(1, steps=200)  # 10 s of work: it holds it throughout
        p.holding(1)
        p.worker.leave(2.5)
        asks = 0
        while True:
            _i, kind, msg = p.next({protocol.Kind.LEAVING, protocol.Kind.LEFT})
            if kind is protocol.Kind.LEFT:
                break
            asks += 1
        assert msg.reason == "grace_expired" and asks >= 2  # asked again while unanswered (every second)
        assert 1 not in p.results  # the unfinished batch is the scheduler's to retry
    finally:
        p.close()


def test_told_to_register_again_while_leaving_it_goes_at_once(played):
    played.batch(1, steps=200)
    played.holding(1)
    played.worker.leave()
    played.next({protocol.Kind.LEAVING})
    told = time.monotonic()
    played.send(protocol.Kind.WORKER_STOP, protocol.WorkerStopMsg("reregister"))  # a new scheduler run
    played.gone(5)
    assert time.monotonic() - told < 1.0 and played.worker.left_reason is None  # not by LEFT: nobody to tell


def test_an_operators_leave_then_a_sigterm_is_still_one_graceful_leave(played):
    played.batch(1, steps=10)
    played.send(protocol.Kind.WORKER_STOP, protocol.WorkerStopMsg("leave"))
    played.next({protocol.Kind.LEAVING})
    played.worker.leave()  # the pod's SIGTERM, right after: not a second one
    played.send(protocol.Kind.LEAVE_ACK, protocol.LeaveAckMsg([1]))
    _i, _k, left = played.next({protocol.Kind.LEFT})
    assert left.reason == "finished" and played.results == {1}
    played.worker.leave()  # a second SIGTERM stops at once (it has gone already)
    played.gone(5)


def test_told_to_go_before_it_is_registered_it_says_left_and_before_it_serves_it_says_nothing():
    p = PlayedScheduler(register=False)
    try:
        p.identity, _k, _m = p.next({protocol.Kind.REGISTER})  # not answered: REGISTERED is on its way
        p.worker.leave()
        _i, _k, left = p.next({protocol.Kind.LEFT}, timeout_s=5)
        assert left.reason == "unregistered"
        p.gone(5)
    finally:
        p.close()
    q = PlayedScheduler(register=False, leave_first=True)
    try:
        q.gone(5)
        assert not q.sock.poll(300)  # no REGISTER: nobody has heard of it
    finally:
        q.close()


def test_the_replacement_benchmark_runs_its_graceful_arm_exactly():
    run = run_arm("sigterm", workers=2, groups=8, count=2, steps=4, step_s=0.05, signal_at_s=0.3)
    assert run["exact"] and run["statuses"] == ["done"] and run["retries"] == 0
    assert run["worker_exit"] == 0 and run["worker_listed_s"] is not None
    assert "| sigterm |" in report([{**run, "load": "burst"}])
