"""A scheduler that dies is visible to its clients, and resubmitting is safe (core/resubmission.py).

kill -9 of the scheduler with groups in flight: every waiting client (blocking and asyncio) raises
SchedulerUnavailable within the stated bound (2 x liveness_s) instead of waiting out its timeout.
After a restart on the same ports the worker comes back by itself, and each group resubmitted under its
request id gives exactly one result, bitwise the fault-free one (its seeds are fixed). While the
scheduler lives, a resubmission waits for the group's one answer and never runs it twice."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import numpy as np
import pytest

from candidate_scheduler.protocol import Kind
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import Client, SchedulerUnavailable, make_request
from tests.conftest import wait_for
from tests.integration.test_scheduler import IMAGE, assert_single_reply, expected_candidates

LIVENESS_S = 0.5


def test_clients_learn_of_a_dead_scheduler_within_the_bound_and_resubmit_after_a_restart(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8, step_delay=0.1)
    sched.wait_workers(1)
    requests = [make_request(IMAGE, "pick", count=2, seed=10 + i, steps=40, request_id=f"in-flight-{i}",
                             return_candidates=True) for i in range(3)]
    blocking = Client(sched.request, sched.control, liveness_s=LIVENESS_S, timeout_s=120)
    for r in requests[:2]:
        blocking.send(r)
    wait_for(lambda: blocking.status(requests[0].request_id).state == "running", 10, "the first group to run")

    async def async_side():
        client = AsyncClient(sched.request, liveness_s=LIVENESS_S)
        try:
            await client.submit_request(requests[2])
        except SchedulerUnavailable:
            return time.monotonic()
        finally:
            client.close()
        return None

    async_done: list = []
    side = threading.Thread(target=lambda: async_done.append(asyncio.run(async_side())), daemon=True)
    side.start()
    wait_for(lambda: blocking.status(requests[2].request_id).state in ("admitted", "running"), 10,
             "the asyncio client's group in flight")
    killed_at = time.monotonic()
    os.kill(sched.proc.pid, signal.SIGKILL)
    try:
        blocking.wait(requests[0].request_id)
        raise AssertionError("a reply from a killed scheduler")
    except SchedulerUnavailable:
        blocking_after = time.monotonic() - killed_at
    side.join(timeout=30)
    async_after = async_done[0] - killed_at
    bound = 2 * LIVENESS_S + 1.0  # silence, then an unanswered PING; the rest is slack for a busy host
    assert blocking_after <= bound and async_after <= bound, (blocking_after, async_after)

    # the same ports again: the worker re-registers by itself; every group resubmitted gives one result
    again = services.scheduler(*sched.same_ports())
    again.wait_workers(1, timeout_s=30)
    results = {}
    for r in requests:
        blocking.send(r)
    for r in requests:
        results[r.request_id] = blocking.wait(r.request_id, timeout_s=60)
    for i, r in enumerate(requests):
        got = results[r.request_id]
        assert got.status == "done", got.error
        np.testing.assert_array_equal(got.candidates, expected_candidates(10 + i, 2, steps=40))
    assert_single_reply(blocking, requests[0].request_id)
    blocking.close()


def test_resubmit_true_rides_out_a_restart_and_a_live_resubmission_waits_for_the_one_answer(services):
    sched = services.scheduler()
    services.worker(sched, capacity=8, step_delay=0.05)
    sched.wait_workers(1)
    with sched.client(liveness_s=LIVENESS_S) as a, sched.client(liveness_s=LIVENESS_S) as b:
        rid = a.send(make_request(IMAGE, "pick", count=3, seed=5, steps=20, request_id="once", return_candidates=True))
        b.send(make_request(IMAGE, "pick", count=3, seed=5, steps=20, request_id="once", return_candidates=True))
        first, second = a.wait(rid, timeout_s=30), b.wait(rid, timeout_s=30)
        assert first.status == second.status == "done"
        assert first.candidates.tobytes() == second.candidates.tobytes()
        stats = a.stats()
        assert stats["batches_in_flight"] == 0
        later = a.submit(IMAGE, "pick", count=3, seed=5, steps=20, request_id="once", return_candidates=True,
                         timeout_s=10)  # ended: answered from the kept replies, not run again
        assert later.candidates.tobytes() == first.candidates.tobytes()
        assert later.metrics == first.metrics | {"receipt_to_reply_s": later.metrics["receipt_to_reply_s"]}

    ports = sched.same_ports()
    client = Client(sched.request, sched.control, liveness_s=LIVENESS_S, timeout_s=90)
    services_ref = services

    def restart_soon():
        time.sleep(1.5)
        services_ref.scheduler(*ports)

    os.kill(sched.proc.pid, signal.SIGKILL)
    threading.Thread(target=restart_soon, daemon=True).start()
    r = client.submit(IMAGE, "pick", count=2, seed=77, steps=4, request_id="rides-out", return_candidates=True,
                      resubmit=True)
    assert r.status == "done", (r.error_code, r.error)
    np.testing.assert_array_equal(r.candidates, expected_candidates(77, 2))
    client.close()


def test_a_scheduler_restarted_before_the_first_ping_is_seen_by_its_incarnation(services):
    # a supervisor (Ray, systemd) may bring the scheduler back on the same ports faster than a client's
    # liveness PING: the new run answers the PING, but never heard of the group; its PONG's incarnation
    # (protocol.Pong) tells the client so, instead of the group's timeout
    sched = services.scheduler()  # no worker: the groups wait at the scheduler
    liveness = 1.0
    blocking = Client(sched.request, sched.control, liveness_s=liveness, timeout_s=20)
    rid = blocking.send(make_request(IMAGE, "pick", count=2, seed=3, steps=4, request_id="before-restart"))
    wait_for(lambda: blocking.status(rid).state != "unknown", 10, "the group received")

    async def async_side(ready: threading.Event):
        client = AsyncClient(sched.request, liveness_s=liveness)
        task = asyncio.ensure_future(client.submit_request(
            make_request(IMAGE, "pick", count=2, seed=4, steps=4, request_id="async-before-restart")))
        await asyncio.sleep(0.3)
        ready.set()
        try:
            await asyncio.wait_for(task, 20)
        except SchedulerUnavailable as exc:
            return time.monotonic(), str(exc)
        finally:
            client.close()
        return None

    ready, async_done = threading.Event(), []
    side = threading.Thread(target=lambda: async_done.append(asyncio.run(async_side(ready))), daemon=True)
    side.start()
    assert ready.wait(10)
    os.kill(sched.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    services.scheduler(*sched.same_ports())  # back on the same ports before either client probes
    with pytest.raises(SchedulerUnavailable, match="restarted"):
        blocking.wait(rid)
    blocking_after = time.monotonic() - killed_at
    side.join(timeout=30)
    assert async_done and async_done[0] is not None and "restarted" in async_done[0][1]
    async_after = async_done[0][0] - killed_at
    bound = 2 * liveness + 3.0  # the restart itself, then silence and one answered PING
    assert blocking_after <= bound and async_after <= bound, (blocking_after, async_after)
    blocking.close()


def test_a_group_sent_after_a_restart_the_client_had_not_heard_of_is_not_taken_for_lost(services):
    sched = services.scheduler()  # no worker: groups wait at the scheduler
    client = Client(sched.request, sched.control, liveness_s=0.5, timeout_s=20)
    client.ping()  # the client knows this run's incarnation
    os.kill(sched.proc.pid, signal.SIGKILL)
    services.scheduler(*sched.same_ports())  # back at once: the client has heard nothing of it yet
    rid = client.send(make_request(IMAGE, "pick", count=2, seed=5, steps=4, request_id="after-restart"))
    # its PING sees another incarnation, but the new run has the group (STATUS): it waits on, no false alarm
    with pytest.raises(TimeoutError):
        client.wait(rid, timeout_s=3.0)
    assert client.status(rid).state != "unknown"
    client.close()


@pytest.mark.parametrize("with_control", [True, False])
def test_an_async_group_sent_after_an_unheard_restart_waits_on_with_a_control_link(services, with_control):
    sched = services.scheduler()  # no worker: groups wait at the scheduler

    asked = []  # what the client asked on its control link, and what it was told

    async def run() -> str:
        client = AsyncClient(sched.request, liveness_s=0.5, control=sched.control if with_control else None)
        if with_control:
            ask = client.control.ask

            async def recorded(kind, payload, timeout_s):
                reply = await ask(kind, payload, timeout_s)
                asked.append((kind, None if reply is None else reply.state))
                return reply
            client.control.ask = recorded
        try:
            assert await client.ping(5.0)  # the client knows this run's incarnation
            os.kill(sched.proc.pid, signal.SIGKILL)
            services.scheduler(*sched.same_ports())  # back at once: the client has heard nothing of it yet
            request = make_request(IMAGE, "pick", count=2, seed=5, steps=4, request_id="async-after-restart")
            try:
                await asyncio.wait_for(client.submit_request(request), 3.0)
            except TimeoutError:
                return "waiting"
            except SchedulerUnavailable as exc:
                return str(exc)
            return "answered"
        finally:
            client.close()

    outcome = asyncio.run(run())
    if with_control:
        # its PING sees another incarnation, but the new run has the group (STATUS): it waits on
        assert outcome == "waiting"
        assert asked and all(kind is Kind.STATUS and state not in (None, "unknown") for kind, state in asked)
        with sched.client() as admin:
            assert admin.status("async-after-restart").state != "unknown"
    else:  # no way to ask: reported as sent to the run before (the documented behaviour without control)
        assert "restarted" in outcome
