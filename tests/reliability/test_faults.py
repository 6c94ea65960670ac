"""Fault injection: broken adapters (workers/faults.py), SIGKILL / SIGSTOP at random denoise steps, a
worker that answers after it was declared dead, results lost on the link, scheduler restarts.

Every group must get exactly one reply, and every "done" reply must equal the fault-free result
(the null worker is deterministic, so "equal" is bit for bit).
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter

import pytest

from candidate_scheduler.service.client import make_request, synthetic_image
from tests.conftest import wait_for
from tests.reliability.helpers import (
    IMAGE,
    Ledger,
    ReplyReader,
    check_result,
    fault_lines,
    random_request,
    stats,
    wait_quiescent,
)

pytestmark = pytest.mark.timeout(900)


def _pid_of(worker_id: str) -> int:
    # default worker ids are f"{hostname}-{pid}-{hex6}"
    return int(worker_id.rsplit("-", 2)[1])


def _retries(ledger: Ledger) -> int:
    return sum(int(r.metrics.get("retries", 0)) for rs in ledger.replies.values() for r in rs)


def test_adapter_faults_never_change_a_result(services, reliability, rng_seed):
    """Two workers whose adapters return malformed / wrong-shaped / wrong-id results, raise, or permute
    rows (workers/faults.py): each group is answered once, with the fault-free result."""
    sched = services.scheduler("--retry-limit", "25")
    spec = "malformed:0.35,raise:0.1,shuffle:0.1"
    w1 = services.worker(sched, "null", 8, 0.0, "--fault", f"{spec},seed={rng_seed}")
    w2 = services.worker(sched, "null", 8, 0.0, "--fault", f"{spec},seed={rng_seed + 1}")
    sched.wait_workers(2)
    rnd = random.Random(rng_seed)
    ledger = Ledger()
    reader = ReplyReader(sched.request, ledger)
    n = reliability.scale.fault_groups
    for i in range(n):
        reader.send(random_request(rnd, request_id=f"fault-{i}", max_count=12))
        if len(reader.outstanding) >= 6:
            reader.poll_once(30)
    reader.wait_all(120)
    wait_quiescent(sched)
    reader.barrier()
    reader.close()
    faults = fault_lines(w1) + fault_lines(w2)
    assert stats(sched)["handler_errors"] == 0
    s = ledger.summary()
    reliability.add("faults", "adapter faults (--fault " + spec + "): "
                    + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())), sum(faults.values()),
                    f"{n} groups: {ledger.statuses['done']} done, {n - s['wrong_results'] - s['partial_aggregates']} "
                    f"equal to the fault-free result; {_retries(ledger)} slice retries; lost {s['lost']}, "
                    f"duplicated {s['duplicated']}, partial {s['partial_aggregates']}",
                    ok=s["lost"] == s["duplicated"] == s["partial_aggregates"] == s["wrong_results"] == 0)
    ledger.assert_clean(reliability)
    assert ledger.statuses["done"] == n, ledger.statuses
    assert sum(v for k, v in faults.items() if k != "shuffle") > 0, "no fault was injected"


def _kill_or_stop_at_steps(services, reliability, rng_seed, mode: str):
    sched = services.scheduler("--retry-limit", "10", "--heartbeat-interval", "0.05")
    for _ in range(3):
        services.worker(sched, capacity=4, step_delay=0.06)
    ids = set(sched.wait_workers(3)["workers"])
    rnd = random.Random(rng_seed)
    ledger = Ledger()
    reader = ReplyReader(sched.request, ledger)
    events = []
    rounds = reliability.scale.kills if mode == "kill" else reliability.scale.stops
    for k in range(rounds):
        for j in range(3):
            reader.send(random_request(rnd, request_id=f"{mode}-{k}-{j}", max_count=8, steps=(6, 10)))
        target = rnd.randint(0, 5)

        def victim():
            for wid, w in stats(sched)["workers"].items():
                if w["busy"] and w["step"] is not None and w["step"] >= target:
                    return wid, w["step"]
            return None

        wid, step = wait_for(victim, 30, f"a worker at denoise step {target}", interval_s=0.01)
        pid = _pid_of(wid)
        if mode == "kill":
            os.kill(pid, signal.SIGKILL)
            services.worker(sched, capacity=4, step_delay=0.06)  # keep the capacity
            events.append(step)
            reader.wait_all(60)
        else:
            os.kill(pid, signal.SIGSTOP)
            try:
                wait_for(lambda: wid not in stats(sched)["workers"], 30, "the stopped worker to be declared dead")
                resume_early = rnd.random() < 0.5  # answer while its slices are being retried, or after
                if resume_early:
                    os.kill(pid, signal.SIGCONT)
                reader.wait_all(60)
            finally:
                os.kill(pid, signal.SIGCONT)
            # told to register again, it drops its old batch (an answer that crossed that is discarded as
            # late, never a second reply) and rejoins by itself
            wait_for(lambda: wid in stats(sched)["workers"], 30, "the resumed worker to re-register")
            events.append(step)
    wait_quiescent(sched)
    reader.barrier()
    reader.close()
    assert stats(sched)["handler_errors"] == 0
    s = ledger.summary()
    what = "SIGKILL" if mode == "kill" else "SIGSTOP, declared dead, then SIGCONT (old batch dropped)"
    reliability.add("faults", f"{what} of a null worker at denoise steps {events}", rounds,
                    f"{s['requests']} groups: {ledger.statuses['done']} done = fault-free result, "
                    f"{_retries(ledger)} retries from snapshots; lost {s['lost']}, duplicated {s['duplicated']}")
    ledger.assert_clean(reliability)
    assert ledger.statuses["done"] == s["requests"], ledger.statuses
    assert _retries(ledger) >= rounds
    return ids


def test_sigkill_workers_at_random_denoise_steps(services, reliability, rng_seed):
    _kill_or_stop_at_steps(services, reliability, rng_seed, "kill")


def test_sigstopped_workers_answer_after_they_were_declared_dead(services, reliability, rng_seed):
    _kill_or_stop_at_steps(services, reliability, rng_seed, "stop")


def test_a_result_over_the_message_limit_fails_its_group_at_once_and_frees_the_worker(services, reliability):
    """A worker whose result would be over the 64 MiB MAXMSGSIZE must not hold the group -- or the
    worker -- forever. Sent, ZMQ dropped it with the connection and the scheduler found the batch lost
    only from the heartbeats, then retried it, to the same end (worker/answers.py); now the worker
    answers the group `result_too_large` at once (a retry would compute the same bytes), and serves the
    next group. A batch lost on the link is still found from the heartbeats (tests/unit/test_engine.py,
    test_engine_detects_a_batch_lost_on_the_link)."""
    sched = services.scheduler("--retry-limit", "2")
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    ledger = Ledger()
    reader = ReplyReader(sched.request, ledger)
    # 8 candidates x 266240 steps x 8 dims x 4 bytes = 68 MB of actions in one BATCH_RESULT
    big = make_request(IMAGE, "pick", request_id="too-big", count=8, horizon=266240, raw_action_dim=8)
    reader.send(big)
    r = reader.wait("too-big", 120)
    assert (r.status, r.error_code) == ("failed", "result_too_large") and r.action is None, (r.status, r.error)
    reader.send(make_request(IMAGE, "pick", request_id="next", count=4, seed=3, return_candidates=True))
    nxt = reader.wait("next", 30)
    assert check_result(ledger.requests["next"], nxt) == ("ok", None) and nxt.status == "done"
    wait_quiescent(sched)
    reader.barrier()
    reader.close()
    counters = stats(sched)
    assert counters["batches_lost"] == 0  # answered, not lost: nothing waited for the heartbeats
    reliability.add("faults", "a result over the message limit (68 MB BATCH_RESULT > MAXMSGSIZE; worker alive)", 1,
                    f"the worker answered it {r.error_code} at once, no batch lost ({counters['batches_lost']}); "
                    f"group answered once: {r.status}; worker freed, next group correct")
    ledger.assert_clean(reliability)


def _answered(reader: ReplyReader, rid: str) -> bool:
    try:
        reader.wait(rid, 10)
        return True
    except TimeoutError:
        return False


def _restart(services, ports: list[str], *extra):
    return services.scheduler(*ports, *extra)


def test_scheduler_restart_loses_nothing_silently(services, reliability, rng_seed):
    """Groups in flight (queued and running) when the scheduler stops. Graceful stop (SIGTERM): every
    client gets one reply, done or failed/shutting_down. SIGKILL: nobody is left to answer; the restarted
    scheduler says "unknown" for those ids. Either way the workers come back by themselves and a retry
    with the same request_id gives exactly the fault-free result."""
    sched = services.scheduler()
    for _ in range(2):
        services.worker(sched, capacity=4, step_delay=0.05)
    worker_ids = set(sched.wait_workers(2)["workers"])
    ports = sched.same_ports()
    rnd = random.Random(rng_seed)
    modes = ["sigterm", "sigkill"] * max(1, reliability.scale.stops // 2)
    held = []
    retried = 0
    for k, mode in enumerate(modes):
        ledger = Ledger()
        reader = ReplyReader(sched.request, ledger)
        n = reliability.scale.restart_groups
        reqs = [random_request(rnd, request_id=f"rs-{k}-{i}", max_count=8, steps=(6, 12)) for i in range(n)]
        for req in reqs:
            reader.send(req)
        wait_for(lambda: any(w["step"] is not None for w in stats(sched)["workers"].values()), 30, "a group running")
        if mode == "sigterm":
            reader.barrier()  # the scheduler has read every SUBMIT so far
            # a last burst right before the signal: whatever of it was read gets an answer (queued but
            # unread at shutdown: rejected/stopping); what never reached the scheduler is "unknown" below
            late = [random_request(rnd, request_id=f"rs-{k}-late-{i}", max_count=8) for i in range(10)]
            for req in late:
                reader.send(req)
            reqs += late
            sched.proc.proc.terminate()
            sched.proc.proc.wait(timeout=30)
            read_before = [r.request_id for r in reqs if r not in late]
            missing = [rid for rid in read_before if rid in reader.outstanding and not _answered(reader, rid)]
            assert not missing, f"graceful stop left clients without a reply: {missing}"
            while reader.outstanding and reader.poll_once(0.3):
                pass  # the rest of what the exited process sent (the late burst), already on its way to us
            for rid, rs in ledger.replies.items():
                # in flight: failed/shutting_down; still unread in the socket: rejected/stopping
                assert (rs[0].status, rs[0].error_code) in (("done", None), ("failed", "shutting_down"),
                                                            ("rejected", "stopping")), (rid, rs[0].status)
        else:
            sched.proc.proc.kill()
        sched.proc.proc.wait(timeout=30)
        answered = {rid: rs[0].status for rid, rs in ledger.replies.items()}
        lost = set(ledger.requests) - set(answered)
        sched = _restart(services, ports)
        # the same worker processes re-register by themselves (nobody restarted them)
        wait_for(lambda: set(stats(sched)["workers"]) == worker_ids, 60, "the workers to reconnect by themselves")
        with sched.client() as c:
            states = {rid: c.status(rid).state for rid in lost}
        # A SUBMIT the old scheduler never read is either gone with it ("unknown" now) or was still queued
        # in the client's DEALER, which re-sends it to the new scheduler on reconnect: then the new one
        # owns it and answers it on the same connection.
        unknown = {rid for rid, st in states.items() if st == "unknown"}
        redelivered = set(lost) - unknown
        for rid in redelivered:
            reader.wait(rid, 60)
        wait_quiescent(sched)
        reader.barrier()  # nothing else arrives on the old connection: no late or stray reply
        assert {rid: rs[0].status for rid, rs in ledger.replies.items() if rid in answered} == answered
        assert set(ledger.replies) == set(answered) | redelivered
        assert not ledger.duplicated
        for rid, rs in ledger.replies.items():  # what was answered is well-formed (done = fault-free)
            assert check_result(ledger.requests[rid], rs[0])[0] == "ok", rid
        reader.close()
        retry_ledger = Ledger()
        retry = ReplyReader(sched.request, retry_ledger)
        for req in reqs:
            first = ledger.replies.get(req.request_id)
            if not first or first[0].status != "done":
                retry.send(req)  # same request_id, same seed: same result
        retry.wait_all(60)
        wait_quiescent(sched)
        retry.barrier()
        retry.close()
        retry_ledger.assert_clean(reliability)
        reliability.tally(requests=len(ledger.requests) - len(unknown), replies=sum(len(r) for r in ledger.replies.values()),
                          sigkilled_in_flight=len(unknown))
        assert retry_ledger.statuses["done"] == len(retry_ledger.requests), retry_ledger.statuses
        retried += len(retry_ledger.requests)
        how = ", ".join(f"{v} {k}" for k, v in sorted(Counter(answered.values()).items()))
        held.append(f"{mode}: {len(answered)} answered ({how or 'none'}), {len(unknown)} unanswered -> STATUS "
                    f"unknown" + (f", {len(redelivered)} re-sent by ZMQ to the new scheduler and answered there"
                                  if redelivered else ""))
    reliability.add("faults", "scheduler restart with groups in flight (" + "; ".join(held) + ")", len(modes),
                    f"workers reconnected by themselves every time; {retried} retries with the same request_id "
                    f"all done = fault-free result; no late or duplicate reply")


def test_stale_result_from_before_a_restart_is_not_taken_for_a_new_batch(services, reliability):
    """After a scheduler SIGKILL + restart, a worker was still running a batch of the old scheduler. The
    client retries the same request_id with a NEW observation (what a robot does); the stale batch must not
    answer the new one: the worker drops it when the new scheduler tells it to register again (and a
    result already on its way is discarded as late: batch ids do not repeat across runs)."""
    sched = services.scheduler()
    services.worker(sched, capacity=8, step_delay=0.1)
    wid = next(iter(sched.wait_workers(1)["workers"]))
    ports = sched.same_ports()
    old_obs, new_obs = synthetic_image(64, 64, seed=11), synthetic_image(64, 64, seed=12)
    with sched.client() as c:
        c.send(make_request(old_obs, "pick", request_id="robot-1", count=4, seed=7, steps=40))
        wait_for(lambda: (stats(sched)["workers"][wid]["step"] or 0) >= 2, 30, "the old batch to be running")
    sched.proc.proc.kill()
    sched.proc.proc.wait(timeout=30)
    sched = _restart(services, ports)

    def reregistered_and_idle():
        w = stats(sched)["workers"].get(wid)
        return w is not None and w["step"] is None

    wait_for(reregistered_and_idle, 30, "the worker back, its old batch dropped (not run to its end)")
    ledger = Ledger()
    reader = ReplyReader(sched.request, ledger)
    req = make_request(new_obs, "pick", request_id="robot-1", count=4, seed=7, steps=2, return_candidates=True)
    reader.send(req)
    r = reader.wait("robot-1", 60)
    wait_quiescent(sched)
    reader.barrier()
    reader.close()
    verdict, why = check_result(req, r)
    reliability.add("faults", "stale result from before a scheduler restart vs. a retried request_id", 1,
                    f"retry answered from its own observation ({verdict}); stale batch dropped by the worker")
    assert r.status == "done" and verdict == "ok", (r.status, why)
    ledger.assert_clean(reliability)
