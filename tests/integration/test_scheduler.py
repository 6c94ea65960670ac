"""The scheduler service with real processes on real sockets, using the model-free null worker
(fast, deterministic: a candidate's action is a pure function of its seed and the observation).
The same scenarios on the real Cosmos3 worker live in test_scheduler_cosmos3.py."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import msgspec
import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.core import rng
from candidate_scheduler.core.reducers import reduce
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.client import make_request, synthetic_image
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.conftest import hold_the_worker, wait_for

IMAGE = synthetic_image(64, 64, seed=3)


def expected_candidates(seed: int, count: int, policy: str = "per_candidate", steps: int = 4) -> np.ndarray:
    sampling = SamplingSpec(steps=steps)
    mean = float(IMAGE.astype(np.float64).mean())
    return np.stack([NullAdapter.expected(s, mean, sampling) for s in rng.candidate_seeds(seed, count, policy)])


def assert_single_reply(client, request_id: str, wait_s: float = 0.3) -> None:
    """Nothing else arrives for this group after its one reply (a client drops what nobody awaits, and
    counts it: `unclaimed`)."""
    before = client.unclaimed
    time.sleep(wait_s)
    assert client.ping(5), "the scheduler answers"  # reads whatever came before its PONG
    assert client.unclaimed == before, f"{client.unclaimed - before} more reply(ies) after {request_id!r}'s one"


def test_group_round_trip_reduces_real_candidates(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    with sched.client() as c:
        r = c.submit(IMAGE, "pick", count=8, reducer="medoid", seed=11, return_candidates=True, request_id="g1")
        assert r.status == "done", r.error
        want = expected_candidates(11, 8)
        assert r.candidate_seeds == list(rng.candidate_seeds(11, 8, "per_candidate"))
        np.testing.assert_array_equal(r.candidates, want)
        # medoid serves a real candidate, the one it names
        np.testing.assert_array_equal(r.action, want[r.chosen_candidate])
        assert r.metrics["admission_mode"] == "atomic" and r.metrics["physical_batches"] == 1
        m = c.submit(IMAGE, "pick", count=8, reducer="mean", seed=11, request_id="g2")
        assert m.candidates is None  # not asked for
        np.testing.assert_array_equal(m.action, reduce("mean", want))
        assert_single_reply(c, "g1")


def test_ping_keeps_a_result_that_arrives_before_its_pong(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=2, seed=5))
        time.sleep(1.0)  # the null worker answers long before: its RESULT is read ahead of the PONG
        assert c.ping()
        r = c.wait(rid, timeout_s=10)
        assert r.status == "done"
        np.testing.assert_array_equal(r.action, reduce("mean", expected_candidates(5, 2)))
        assert c.ping()


def test_microbatched_group_equals_atomic_group(services):
    small = services.scheduler()
    services.worker(small, capacity=3)
    big = services.scheduler()
    services.worker(big, capacity=8)
    small.wait_workers(1)
    big.wait_workers(1)
    with small.client() as a, big.client() as b:
        split = a.submit(IMAGE, "pick", count=8, seed=5, return_candidates=True)
        whole = b.submit(IMAGE, "pick", count=8, seed=5, return_candidates=True)
    assert split.metrics["admission_mode"] == "microbatch" and split.metrics["microbatches"] == 3
    assert whole.metrics["admission_mode"] == "atomic"
    np.testing.assert_array_equal(split.candidates, whole.candidates)
    assert split.action.tobytes() == whole.action.tobytes()


def test_sequential_and_reject_policies(services):
    seq = services.scheduler("--policy", "sequential")
    services.worker(seq, capacity=4)
    rej = services.scheduler("--policy", "reject")
    services.worker(rej, capacity=4)
    seq.wait_workers(1)
    rej.wait_workers(1)
    with seq.client() as a, rej.client() as b:
        r = a.submit(IMAGE, "pick", count=6, seed=9, return_candidates=True)
        assert r.metrics["admission_mode"] == "sequential" and r.metrics["microbatches"] == 6
        np.testing.assert_array_equal(r.candidates, expected_candidates(9, 6))
        x = b.submit(IMAGE, "pick", count=6, seed=9)
        assert x.status == "rejected" and x.error_code == "does_not_fit" and x.action is None
        ok = b.submit(IMAGE, "pick", count=4, seed=9)
        assert ok.status == "done"


def test_unrelated_groups_share_a_batch_and_keep_their_identity(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8, step_delay=0.05)
    sched.wait_workers(1)
    with sched.client() as c:
        held = hold_the_worker(c, IMAGE, "pick", steps=20)
        a = c.send(make_request(IMAGE, "pick", count=3, seed=21, return_candidates=True, request_id="A"))
        b = c.send(make_request(IMAGE, "pick", count=4, seed=42, return_candidates=True, request_id="B"))
        ra, rb = c.wait(a), c.wait(b)
        assert all(c.wait(rid).status == "done" for rid in held)
    assert ra.metrics["co_batched_batches"] == 1 and rb.metrics["co_batched_batches"] == 1
    np.testing.assert_array_equal(ra.candidates, expected_candidates(21, 3))
    np.testing.assert_array_equal(rb.candidates, expected_candidates(42, 4))
    assert (ra.request_id, rb.request_id) == ("A", "B")


def test_cancel_everywhere_answers_exactly_once(services):
    sched = services.scheduler()
    with sched.client() as c:
        # queued: no worker yet
        q = c.send(make_request(IMAGE, "pick", count=2, request_id="queued"))
        wait_for(lambda: c.status(q).state == "queued", 5, "queued")
        first = c.cancel(q)
        assert first.changed and first.state == "queued"
        assert c.wait(q).status == "cancelled"
        again = c.cancel(q)
        assert not again.changed and again.state == "cancelled"
        assert c.cancel("never-seen").state == "unknown"
        assert_single_reply(c, q)

        services.worker(sched, capacity=8, step_delay=0.05)
        sched.wait_workers(1)
        # running: the worker drops the group at the next step boundary and the slot frees at once
        run = c.send(make_request(IMAGE, "pick", count=4, steps=200, request_id="running"))
        wait_for(lambda: c.status(run).state == "running", 10, "running")
        t0 = time.monotonic()
        reply = c.cancel(run)
        assert reply.changed and reply.state == "running"
        r = c.wait(run, timeout_s=5)
        assert r.status == "cancelled" and r.action is None and r.candidates is None
        nxt = c.submit(IMAGE, "pick", count=2, seed=3, steps=2, timeout_s=5)
        assert nxt.status == "done"
        assert time.monotonic() - t0 < 5.0  # 200 steps x 50 ms would be 10 s
        # after done: nothing changes, and the state says so
        after = c.cancel(nxt.request_id)
        assert not after.changed and after.state == "done"
        assert_single_reply(c, run)
        stats = c.stats()
        assert stats["groups_in_flight"] == 0 and stats["batches_in_flight"] == 0


def test_sigkill_mid_group_retries_from_snapshots(services):
    sched = services.scheduler()
    w1 = services.worker(sched, capacity=4, step_delay=0.2)
    services.worker(sched, capacity=4, step_delay=0.2)
    sched.wait_workers(2)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=8, seed=77, return_candidates=True, steps=6))
        wait_for(lambda: all(w["step"] is not None and w["step"] >= 1 for w in c.stats()["workers"].values()), 10,
                 "both workers mid-denoise")
        os.kill(w1.pid, signal.SIGKILL)
        r = c.wait(rid, timeout_s=30)
        assert r.status == "done", r.error
        assert r.metrics["retries"] == 1
        np.testing.assert_array_equal(r.candidates, expected_candidates(77, 8, steps=6))
        assert_single_reply(c, rid)


def test_sigstopped_worker_is_declared_dead_and_its_work_retried_once(services):
    sched = services.scheduler()
    stopped = services.worker(sched, capacity=8, step_delay=0.1)
    sched.wait_workers(1)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=4, seed=8, return_candidates=True, steps=6))
        wait_for(lambda: c.status(rid).state == "running", 10, "running")
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: not c.stats()["workers"], 10, "the stopped worker to be declared dead")
            services.worker(sched, capacity=8)
            r = c.wait(rid, timeout_s=30)
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        assert r.status == "done" and r.metrics["retries"] == 1
        np.testing.assert_array_equal(r.candidates, expected_candidates(8, 4, steps=6))
        # the resumed worker is told to register again and drops its old batch (an answer that crossed
        # that is discarded as late): never a second reply, and it serves again
        wait_for(lambda: len(c.stats()["workers"]) == 2, 15, "the resumed worker registered again")
        assert_single_reply(c, rid)
        again = c.submit(IMAGE, "pick", count=8, seed=9, return_candidates=True, steps=2)
        assert again.status == "done" and again.metrics["retries"] == 0


def test_retry_limit_fails_the_group_with_a_clear_error(services):
    sched = services.scheduler("--retry-limit", "1")
    w = services.worker(sched, capacity=8, step_delay=0.2)
    sched.wait_workers(1)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=2, steps=10))
        wait_for(lambda: c.status(rid).state == "running", 10, "running")
        os.kill(w.pid, signal.SIGKILL)
        r = c.wait(rid, timeout_s=15)
        assert r.status == "failed" and r.error_code == "retries_exhausted" and r.action is None
        assert "heartbeat_timeout" in r.error


def test_deadline_overload_duplicate_and_drain(services):
    sched = services.scheduler("--max-queued-groups", "2")
    with sched.client() as c:
        e = c.submit(IMAGE, "pick", count=2, deadline_s=0.2, timeout_s=5)
        assert e.status == "expired" and e.error_code == "deadline_exceeded"
        a = c.send(make_request(IMAGE, "pick", request_id="a"))
        with sched.client() as again:  # a resubmission (another socket): it waits for the group's one answer
            again.send(make_request(IMAGE, "pick", request_id="a"))
            c.send(make_request(IMAGE, "pick", request_id="b"))
            over = c.submit(IMAGE, "pick", timeout_s=5)
            assert over.status == "overloaded"
            assert c.drain().state == "draining"
            late = c.submit(IMAGE, "pick", timeout_s=5)
            assert late.status == "rejected" and late.error_code == "draining"
            services.worker(sched, capacity=8)
            first = c.wait(a, timeout_s=30)
            assert first.status == "done"  # in-flight groups still finish
            resent = again.wait("a", timeout_s=30)
            assert resent.status == "done" and resent.action.tobytes() == first.action.tobytes()
        assert c.wait("b", timeout_s=30).status == "done"


def test_invalid_specs_get_typed_errors_and_service_keeps_serving(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    with sched.client() as c:
        cases = [
            (dict(count=0), "count"),
            (dict(reducer="nope"), "reducer"),
            (dict(count=2, seeds=[1]), "seeds"),
            (dict(count=300), "count"),
            (dict(height=65), None),
        ]
        for kwargs, field_name in cases:
            r = c.submit(IMAGE, "pick", timeout_s=5, **kwargs)
            assert r.status in ("invalid", "rejected"), (kwargs, r)
            assert r.error, kwargs
            if field_name:
                assert field_name in r.error
        bad = c.submit(IMAGE.astype(np.float32), "pick", timeout_s=5)
        assert bad.status == "invalid" and "uint8" in bad.error
        assert c.submit(IMAGE, "pick", count=2, timeout_s=10).status == "done"


def _raw(endpoint: str, frames: list[bytes], timeout_ms: int = 2000):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart(frames)
        if not s.poll(timeout_ms):
            return None
        return s.recv_multipart()
    finally:
        s.close(0)


def test_malformed_frames_on_every_socket_get_errors(services, tmp_path):
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    valid = protocol.encode(protocol.Kind.SUBMIT, make_request(IMAGE, "pick"))
    cases = {
        "one frame": [b"\x01"],
        "three frames": [protocol.header(protocol.Kind.SUBMIT), b"", b"x", b"y"],
        "bad msgpack": [protocol.header(protocol.Kind.SUBMIT), b"\xc1\xc1\xc1"],
        "wrong types": [protocol.header(protocol.Kind.SUBMIT), msgspec.msgpack.encode({"request_id": 5, "images": "x"})],
        "unknown kind": [bytes([protocol.PROTOCOL_VERSION, 0x7F]), valid[1]],
        "bad version": [bytes([99, protocol.Kind.SUBMIT]), valid[1]],
        "pickle": [protocol.header(protocol.Kind.SUBMIT), pickle.dumps(Evil())],
        "control kind on request socket": [protocol.header(protocol.Kind.CANCEL), msgspec.msgpack.encode({"request_id": "x"})],
        "deep nesting": [protocol.header(protocol.Kind.SUBMIT), b"\x91" * 100_000 + b"\x00"],
        "no bytes, a dimension numpy cannot make": protocol.encode(protocol.Kind.SUBMIT, msgspec.structs.replace(
            make_request(IMAGE, "pick"), images=protocol.Array("uint8", [0, 2**64 - 1, 3], b""))),
    }
    for name, frames in cases.items():
        reply = _raw(sched.request, frames)
        assert reply is not None, name
        kind = protocol.parse_header(reply[0], {protocol.Kind.ERROR, protocol.Kind.RESULT})
        msg = protocol.decode(kind, reply[1])
        assert (kind is protocol.Kind.ERROR and msg.error_code) or msg.status == "invalid", name
    # a SUBMIT it cannot read but whose id it can: the ERROR names the group, so a client with several in
    # flight can tell whose it is (a mistyped field: make_request refuses it, a hand-built one gets here)
    mistyped = msgspec.msgpack.encode({**msgspec.structs.asdict(make_request(IMAGE, "pick", request_id="named")),
                                       "seed": "forty-two"})
    reply = _raw(sched.request, [protocol.header(protocol.Kind.SUBMIT), mistyped])
    msg = protocol.decode(protocol.parse_header(reply[0], {protocol.Kind.ERROR}), reply[1])
    assert (msg.error_code, msg.request_id) == ("bad_type", "named")
    for name, frames in {
        "bad msgpack": [protocol.header(protocol.Kind.CANCEL), b"\xc1"],
        "submit on control": valid,
        "pickle": [protocol.header(protocol.Kind.CANCEL), pickle.dumps(Evil())],
    }.items():
        reply = _raw(sched.control, frames)
        assert reply is not None and protocol.parse_header(reply[0], {protocol.Kind.ERROR}) is protocol.Kind.ERROR, name
    # the worker link answers nothing to garbage but must keep working
    for frames in ([b"junk"], [protocol.header(protocol.Kind.REGISTER), b"\xc1"], [protocol.header(protocol.Kind.BATCH_RESULT), pickle.dumps(Evil())]):
        _raw(sched.worker, frames, timeout_ms=100)
    # oversize observation: over MAX_OBSERVATION_BYTES but under the socket's message cap
    big = make_request(np.ones((3400, 3400, 3), np.uint8), "pick")
    with sched.client() as c:
        r = c.wait(c.send(big), timeout_s=10)
        assert r.status == "invalid" and r.error_code == "oversize"
        assert c.submit(IMAGE, "pick", count=2, timeout_s=10).status == "done"
        assert c.stats()["workers"], "the worker survived the garbage on its link"
    assert not marker.exists(), "a pickle was executed"


def test_worker_link_refuses_nonlocal_bind_without_curve(services, tmp_path):
    cmd = [sys.executable, "-m", "candidate_scheduler.cli", "serve", "--worker-host", "0.0.0.0", "--worker-port", "0",
           "--request-port", "0", "--control-port", "0", "--metrics-port", "-1", "--no-compat"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "CURVE" in out.stderr


def test_curve_authenticated_worker_registers_and_anonymous_one_does_not(services, tmp_path):
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "candidate_scheduler.cli", "keys", str(keys)], check=True, capture_output=True)
    sched = services.scheduler("--worker-host", "0.0.0.0", "--curve-dir", str(keys))
    port = sched.worker.rsplit(":", 1)[1]
    sched.worker = f"tcp://127.0.0.1:{port}"
    services.worker(sched, "null", 8, 0.0)  # no keys
    time.sleep(2.0)  # nothing to wait for: an unauthenticated worker must stay invisible
    with sched.client() as c:
        assert c.stats()["workers"] == {}
    services.worker(sched, "null", 8, 0.0, "--curve-dir", str(keys))
    stats = sched.wait_workers(1, timeout_s=20)
    assert len(stats["workers"]) == 1
    with sched.client() as c:
        assert c.submit(IMAGE, "pick", count=2, timeout_s=10).status == "done"


def test_scheduler_restart_workers_reconnect_and_lost_clients_get_an_error(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8, step_delay=0.2)
    sched.wait_workers(1)
    port = sched.request.rsplit(":", 1)[1]
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, "pick", count=2, seed=4, steps=50, request_id="lost"))
        wait_for(lambda: c.status(rid).state == "running", 10, "running")
        c.shutdown()
        r = c.wait(rid, timeout_s=10)
        assert r.status == "failed" and r.error_code == "shutting_down"
    sched.proc.proc.wait(timeout=10)
    # a new scheduler on the same worker link port: the worker comes back by itself
    wport = sched.worker.rsplit(":", 1)[1]
    again = services.scheduler("--worker-port", wport, "--request-port", port)
    again.wait_workers(1, timeout_s=30)
    with again.client() as c:
        r = c.submit(IMAGE, "pick", count=2, seed=4, steps=2, request_id="lost", return_candidates=True, timeout_s=30)
        assert r.status == "done"
        np.testing.assert_array_equal(r.candidates, expected_candidates(4, 2, steps=2))


def test_async_client_many_groups_in_flight_on_one_socket(services):
    import asyncio

    from candidate_scheduler.service.async_client import AsyncClient

    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)

    async def main():
        client = AsyncClient(sched.request)
        try:
            assert await client.ping()
            results = await asyncio.gather(
                *[client.submit(IMAGE, "pick", count=3, seed=100 + i, return_candidates=True, request_id=f"a{i}")
                  for i in range(12)]
            )
        finally:
            client.close()
        return results

    results = asyncio.run(main())
    assert [r.request_id for r in results] == [f"a{i}" for i in range(12)]
    for i, r in enumerate(results):
        assert r.status == "done"
        np.testing.assert_array_equal(r.candidates, expected_candidates(100 + i, 3))


def test_compat_bridge_counts_reach_the_schedulers_metrics(services):
    import urllib.request

    sched = services.scheduler(compat=True, metrics=True)
    ctx = zmq.Context.instance()
    for payload in (pickle.dumps({"method": "ping"}), b"not a pickle"):
        s = ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(sched.compat)
        s.send(payload)
        assert s.poll(5000), "the bridge answers every message"
        s.recv()
        s.close(0)

    def sample(line_start: str) -> float:
        text = urllib.request.urlopen(sched.metrics, timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    wait_for(lambda: sample('candidate_scheduler_compat_requests_total{type="ping"}') >= 1, 10, "the ping count")
    wait_for(lambda: sample('candidate_scheduler_protocol_errors_total{kind="pickle_refused",socket="compat"}') >= 1,
             10, "the refusal count")


def test_the_next_batch_is_sent_just_in_time_so_a_group_due_sooner_still_goes_in_it(services):
    # late prefetch (serve --prefetch-lead): the shell plans at the engine's wake_at, with no event to
    # wake it, and the batch a busy worker holds next is chosen then, not when it had room
    sched = services.scheduler()
    services.worker(sched, capacity=8, step_delay=0.25)  # a batch: 4 steps of 0.25 s
    sched.wait_workers(1)
    with sched.client() as c:
        c.send(make_request(IMAGE, "pick", count=1, seed=1, request_id="first"))  # the idle worker runs it alone
        wait_for(lambda: c.status("first").state == "running", 10, "the first batch to run")
        sent = {}
        for i in range(16):  # best-effort groups: two batches' worth
            sent[f"be{i}"] = time.monotonic()
            c.send(make_request(IMAGE, "pick", count=1, seed=100 + i, request_id=f"be{i}"))
        wait_for(lambda: c.stats()["groups_in_flight"] == 17, 10, "the scheduler to take the groups")
        # planned (STATS is answered before the pass that ends a burst, so this one comes after it) and
        # none sent: the worker is not due for its next batch until the running one nearly ends
        assert c.stats()["batches_in_flight"] == 1 and c.status("be0").state == "admitted"
        sent["urgent"] = time.monotonic()
        c.send(make_request(IMAGE, "pick", count=1, seed=7, request_id="urgent", deadline_s=20.0))
        ends = {rid: sent[rid] + c.wait(rid, timeout_s=30).metrics["total_s"] for rid in sent}
        assert c.wait("first").status == "done"
    # the urgent group went in the batch after the first (sent at once, that batch would have been
    # eight best-effort groups, and it would have finished a whole batch later than them)
    assert not [rid for rid, end in ends.items() if end < ends["urgent"] - 0.5]
    assert sum(abs(end - ends["urgent"]) < 0.5 for end in ends.values()) == 8  # it and 7 best-effort groups


def test_the_loop_plans_at_the_engines_wake_at_with_no_message_and_no_spin():
    # the shell's side of late prefetch, on its own: ticks far apart, no traffic, one wake-up asked for
    import threading

    from candidate_scheduler.service.server import Scheduler, SchedulerConfig

    class Engine:  # what the loop reads of the engine
        draining = False

        def __init__(self, wake_at: float):
            self.wake_at, self.plans, self.ticks = wake_at, [], []

        def plan(self, now):
            self.plans.append(now)
            self.wake_at = None
            return []

        def tick(self, now):
            self.ticks.append(now)
            return []

        def shutdown(self, now):
            return []

    ports = {f"{name}_endpoint": "tcp://127.0.0.1:0" for name in ("request", "control", "worker")}
    sched = Scheduler(SchedulerConfig(**ports, metrics_port=None, tick_s=2.0))
    sched.bind()
    sched.engine = Engine(wake_at=time.monotonic() + 0.3)
    wake = sched.engine.wake_at
    loop = threading.Thread(target=sched.serve, daemon=True)
    loop.start()
    time.sleep(0.8)
    stopped = time.monotonic()
    sched.stop_now.set()  # seen when the poll returns: at the next tick, 2 s after the first
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert len([t for t in sched.engine.ticks if t < stopped]) == 1  # the first, at start
    [planned] = sched.engine.plans  # exactly one pass: none before the wake-up (no spinning), one at it
    assert wake <= planned < wake + 0.1, planned - wake
