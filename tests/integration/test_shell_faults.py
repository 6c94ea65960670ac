"""The shell's own faults (service/server.py), on a scheduler run in this process (so a fault can be
planted) with a real null worker: a reply that cannot be encoded still answers its group once, and a
planning pass or tick that raises does not end the loop. Before, the reply was lost (the engine had
already taken it and forgotten the group), and a fault in a tick -- a deadline expiry whose reply could
not be encoded -- stopped the scheduler."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import msgspec
import pytest

from candidate_scheduler import convert, protocol
from candidate_scheduler.service.client import Client, make_request
from candidate_scheduler.service.server import Scheduler, SchedulerConfig
from tests.integration.test_scheduler import IMAGE, expected_candidates


@pytest.fixture
def in_process(services):
    """A scheduler serving on a thread of this process, one null worker, and a client of it."""
    sched = Scheduler(SchedulerConfig(request_endpoint="tcp://127.0.0.1:0", control_endpoint="tcp://127.0.0.1:0",
                                      worker_endpoint="tcp://127.0.0.1:0", metrics_port=None))
    bound = sched.bind()
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            sched.serve()
        except BaseException as exc:  # noqa: BLE001 - what the test asserts did not happen
            failed.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    services.worker(SimpleNamespace(worker=bound["worker"], workers=[]), "null", 8, 0.01)
    client = Client(bound["request"], bound["control"], timeout_s=30)
    try:
        yield sched, client, failed
    finally:
        client.close()
        sched.stop_now.set()
        thread.join(10)


def test_a_reply_that_cannot_be_encoded_is_answered_internal_error_once(in_process, monkeypatch):
    sched, c, failed = in_process
    encode = convert.result_to_wire

    def poisoned(result, *args):
        if result.request_id == "poisoned" and result.status == "done":
            raise OverflowError("int too big to convert")  # what msgspec raised for a count past 2**64
        return encode(result, *args)

    monkeypatch.setattr(convert, "result_to_wire", poisoned)
    r = c.submit(IMAGE, "pick", count=2, seed=1, request_id="poisoned")
    assert (r.status, r.error_code) == ("failed", "internal_error") and "OverflowError" in r.error
    ok = c.submit(IMAGE, "pick", count=2, seed=2, return_candidates=True)
    assert ok.status == "done" and (ok.candidates == expected_candidates(2, 2)).all()
    assert c.stats()["handler_errors"] == 1 and not failed


def test_a_tick_or_planning_pass_that_raises_does_not_stop_the_scheduler(in_process, monkeypatch):
    sched, c, failed = in_process
    assert c.submit(IMAGE, "pick", count=1, seed=3).ok  # the worker registered; the loop runs
    for name in ("tick", "plan"):
        real = getattr(sched.engine, name)
        raised = threading.Event()

        def once(*args, real=real, raised=raised, **kwargs):
            if not raised.is_set():
                raised.set()
                raise RuntimeError("a fault of the shell's own")
            return real(*args, **kwargs)

        monkeypatch.setattr(sched.engine, name, once)
        assert raised.wait(5), f"no {name} ran"
        r = c.submit(IMAGE, "pick", count=2, seed=4, return_candidates=True)
        assert r.status == "done" and (r.candidates == expected_candidates(4, 2)).all(), name
    assert c.stats()["handler_errors"] == 2 and not failed


def test_a_reply_over_the_message_limit_is_a_typed_failure(in_process, monkeypatch):
    """A client's socket drops a message over its limit, and libzmq does not bring that connection back
    (a protocol error): every later answer to that client would be lost. So an over-size reply is answered
    `failed` / `reply_too_large` instead. (The limit is lowered here between a request's size and a reply's.)"""
    _sched, c, failed = in_process
    monkeypatch.setattr(protocol, "MAX_MESSAGE_BYTES", 20_000)  # a request is 12 KB; 64 candidates are 28 KB
    r = c.submit(IMAGE, "pick", count=64, seed=5, return_candidates=True)
    assert (r.status, r.error_code) == ("failed", "reply_too_large") and "fewer candidates" in r.error
    small = c.submit(IMAGE, "pick", count=64, seed=5)  # the reduced action alone fits
    assert small.status == "done" and small.candidates is None and not failed


def test_a_submission_the_shell_refuses_is_counted_for_its_tenant(services):
    """tenant_groups_total counts every answer, refusals included (docs/metrics.md); the shell's own
    refusals (forbidden, undecodable arrays, its faults) were counted only in groups_completed_total."""
    from prometheus_client import CollectorRegistry

    from candidate_scheduler.service.metrics import SchedulerMetrics

    registry = CollectorRegistry()
    sched = Scheduler(SchedulerConfig(request_endpoint="tcp://127.0.0.1:0", control_endpoint="tcp://127.0.0.1:0",
                                      worker_endpoint="tcp://127.0.0.1:0", metrics_port=None),
                      metrics=SchedulerMetrics(registry))
    bound = sched.bind()
    thread = threading.Thread(target=sched.serve, daemon=True)
    thread.start()
    client = Client(bound["request"], bound["control"], timeout_s=30)
    try:
        bad = make_request(IMAGE, "pick")
        # 4 bytes short of its shape: the shell cannot decode it, and refuses it before the engine sees it
        images = protocol.Array(bad.images.dtype, bad.images.shape, bad.images.data[:-4])
        r = client.wait(client.send(msgspec.structs.replace(bad, images=images)), timeout_s=30)
        assert r.status == "invalid"
        labels = {"tenant": "default", "outcome": "invalid"}
        assert registry.get_sample_value("candidate_scheduler_tenant_groups_total", labels) == 1
        assert registry.get_sample_value("candidate_scheduler_groups_completed_total", {"outcome": "invalid"}) == 1
    finally:
        client.close()
        sched.stop_now.set()
        thread.join(10)


def test_a_control_request_that_raises_is_answered_internal_error_and_the_loop_serves_on(in_process, monkeypatch):
    """A control request whose handling raises (here the engine's STATUS) was answered nothing: the shell's
    loop logged it and the caller waited out its timeout. Now it is answered, typed, and counted."""
    sched, c, failed = in_process

    def broken(*_args, **_kwargs):
        raise KeyError("owners")

    monkeypatch.setattr(sched.engine, "status", broken)
    reply = c.control(protocol.Kind.STATUS, protocol.StatusRequest("g"), timeout_s=5)
    assert (reply.ok, reply.error_code) == (False, "internal_error") and "KeyError" in reply.error
    monkeypatch.undo()
    assert c.submit(IMAGE, "pick", count=1, seed=6).ok
    assert c.stats()["handler_errors"] == 1 and not failed


def test_a_submission_the_shell_refuses_is_answered_when_its_metric_raises(in_process, monkeypatch):
    """The shell's own refusals (forbidden, undecodable arrays) counted the group before answering it: a
    metrics backend that raised there left the SUBMIT unanswered, to its client's timeout."""
    sched, c, failed = in_process

    def broken(*_args, **_kwargs):
        raise RuntimeError("injected: metrics backend")

    monkeypatch.setattr(sched.metrics, "group_received", broken, raising=False)
    bad = make_request(IMAGE, "pick")
    images = protocol.Array(bad.images.dtype, bad.images.shape, bad.images.data[:-4])  # undecodable
    r = c.wait(c.send(msgspec.structs.replace(bad, images=images)), timeout_s=10)
    assert r.status == "invalid"
    monkeypatch.undo()
    assert c.submit(IMAGE, "pick", count=1, seed=7).ok and c.stats()["handler_errors"] == 1 and not failed


def test_heartbeats_queued_behind_a_burst_are_read_before_workers_are_judged(monkeypatch):
    """A fleet of more than a burst's worth of workers (the loop reads 64 messages from a socket at a time)
    and a loop that stalls past the heartbeat timeout: every worker's heartbeat is waiting when the loop
    comes back, and none of them may be judged dead before it is read."""
    import time

    import zmq

    from candidate_scheduler.core.engine import EngineConfig
    from candidate_scheduler.service import server
    from tests.reliability.helpers import null_capability

    n, timeout_s = 3 * server._BURST // 2, 1.0
    sched = Scheduler(SchedulerConfig(request_endpoint="tcp://127.0.0.1:0", control_endpoint="tcp://127.0.0.1:0",
                                      worker_endpoint="tcp://127.0.0.1:0", metrics_port=None,
                                      engine=EngineConfig(heartbeat_timeout_s=timeout_s, heartbeat_interval_s=0.2)))
    bound = sched.bind()
    thread = threading.Thread(target=sched.serve, daemon=True)
    thread.start()
    ctx = zmq.Context()
    workers = []
    client = Client(bound["request"], bound["control"], timeout_s=30)
    try:
        for i in range(n):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(bound["worker"])
            sock.send_multipart(protocol.encode(protocol.Kind.REGISTER,
                                                protocol.RegisterMsg(f"w{i}", null_capability(8), 8)))
            workers.append(sock)

        def beat() -> None:
            for i, sock in enumerate(workers):
                sock.send_multipart(protocol.encode(protocol.Kind.HEARTBEAT, protocol.HeartbeatMsg(f"w{i}")))

        deadline = time.monotonic() + 30
        while len(client.stats()["workers"]) < n:
            assert time.monotonic() < deadline, "the workers did not register"
            beat()
            time.sleep(0.1)
        # the loop stalls (a slow control request) for longer than the timeout; every worker beats meanwhile
        status = sched.engine.status

        def slow_status(*args, **kwargs):
            time.sleep(1.5 * timeout_s)
            return status(*args, **kwargs)

        monkeypatch.setattr(sched.engine, "status", slow_status)
        stall = threading.Thread(target=lambda: client.control(protocol.Kind.STATUS, protocol.StatusRequest("g"),
                                                               timeout_s=10))
        stall.start()
        time.sleep(timeout_s)
        beat()
        stall.join(10)
        monkeypatch.undo()
        time.sleep(0.3)  # a few ticks
        stats = client.stats()
        assert len(stats["workers"]) == n, f"{n - len(stats['workers'])} live workers judged dead"
    finally:
        client.close()
        for sock in workers:
            sock.close()
        ctx.term()
        sched.stop_now.set()
        thread.join(10)
