"""Every request the bridge takes is answered: when the scheduler dies or restarts, when its queue is
full, when one client's request is over the scheduler's limits, when the bridge is busy or stopping."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest
import zmq

from candidate_scheduler.compat import bridge as bridge_mod
from candidate_scheduler.compat.foreign import ForeignObject, dumps_foreign
from candidate_scheduler.compat.unpickle import safe_loads
from tests.conftest import free_port, services  # noqa: F401  (fixture)
from tests.unit.test_sglang_compat import req

pytestmark = pytest.mark.timeout(300)


def _dealer(endpoint: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _error(sock: zmq.Socket) -> str | None:
    return safe_loads(sock.recv_multipart()[-1]).__dict__.get("error")


@pytest.mark.parametrize("how", ["kill", "restart"])
def test_a_request_in_flight_when_the_scheduler_dies_is_answered(services, how):
    sched = services.scheduler()
    services.worker(sched, "null", 8, 3.0)  # slow: the group is in flight for a while
    sched.wait_workers(1)
    bridge = services.bridge(sched.request, "--control", sched.control, "--liveness", "1")
    c = _dealer(bridge.endpoint)
    c.send_multipart([b"", pickle.dumps({"method": "ping"})])
    assert c.poll(10_000)
    c.recv_multipart()
    c.send_multipart([b"", dumps_foreign(req())])
    time.sleep(1.5)  # submitted, running on the slow worker
    sched.proc.kill()
    if how == "restart":
        port, cport = sched.request.rsplit(":", 1)[1], sched.control.rsplit(":", 1)[1]
        sched2 = services.scheduler("--request-port", port, "--control-port", cport)
        services.worker(sched2, "null", 8, 0.0)
    assert c.poll(30_000), f"the bridge never answered a request whose scheduler was {how}ed"
    assert "unavailable" in (_error(c) or "")
    if how == "restart":  # and the next request is served by the new run
        c.send_multipart([b"", dumps_foreign(req())])
        assert c.poll(60_000)
        assert _error(c) is None


def test_every_request_is_answered_in_time_while_the_scheduler_is_down(services):
    # more requests than the socket's queue holds (1000): sends block, and must be inside the timeout
    dead = f"tcp://127.0.0.1:{free_port()}"
    bridge = services.bridge(dead, "--request-timeout", "1")
    c = _dealer(bridge.endpoint)
    payload = dumps_foreign(req())
    n = 1100
    for _ in range(n):
        c.send_multipart([b"", payload])
    got, deadline = 0, time.monotonic() + 60
    while got < n and time.monotonic() < deadline:
        if c.poll(1000):
            c.recv_multipart()
            got += 1
    assert got == n, f"only {got} of {n} requests were answered (request timeout 1 s, scheduler down)"


def test_one_clients_oversize_request_costs_the_others_nothing(services):
    sched = services.scheduler()
    services.worker(sched, "null", 8, 2.0)
    sched.wait_workers(1)
    bridge = services.bridge(sched.request, "--control", sched.control)
    a, b = _dealer(bridge.endpoint), _dealer(bridge.endpoint)
    a.send_multipart([b"", dumps_foreign(req())])  # ordinary, in flight on the slow worker
    time.sleep(1.0)
    w, h = 4000, 2000  # mode "1": 1 MB each in the pickle, 24 MB each as RGB
    img = ForeignObject("PIL.Image", "Image", state=[{}, "1", (w, h), None, b"\xaa" * ((w + 7) // 8 * h)])
    b.send_multipart([b"", dumps_foreign(req(sp={"image_path": [img, img, img], "prompt": "pick"}))])
    assert b.poll(60_000), "the oversize request was never answered"
    assert "bytes" in (_error(b) or "")
    assert a.poll(30_000), "another client's request was lost to the oversize one"
    assert _error(a) is None


# ---- in process: the bridge's own bounds ---------------------------------------------------------


async def _serve(config: bridge_mod.BridgeConfig):
    b = bridge_mod.Bridge(config)
    endpoint = b.bind()
    return b, endpoint, asyncio.create_task(b.serve())


def test_past_max_in_flight_requests_are_answered_busy_and_pings_still_work(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(bridge_mod, "plan_generation", lambda reqs: release.wait(20) and None)

    async def main():
        dead = f"tcp://127.0.0.1:{free_port()}"
        b, endpoint, serving = await _serve(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=dead,
                                                                    max_in_flight=3))
        c = _dealer(endpoint)
        for _ in range(5):
            c.send_multipart([b"", dumps_foreign(req())])
        errors = []
        for _ in range(2):
            while not c.poll(0):
                await asyncio.sleep(0.02)
            errors.append(_error(c))
        c.send_multipart([b"", pickle.dumps({"method": "ping"})])
        while not c.poll(0):
            await asyncio.sleep(0.02)
        ping = _error(c)
        release.set()
        b.stop()
        await serving
        b.close()
        c.close()
        return errors, ping

    try:
        errors, ping = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        release.set()
    assert all("busy" in (e or "") for e in errors), errors
    assert ping is None


def test_requests_still_being_planned_at_shutdown_are_answered(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(bridge_mod, "plan_generation", lambda reqs: release.wait(30) and None)
    monkeypatch.setattr(bridge_mod, "SHUTDOWN_GRACE_S", 0.5)

    async def main():
        dead = f"tcp://127.0.0.1:{free_port()}"
        b, endpoint, serving = await _serve(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=dead))
        c = _dealer(endpoint)
        c.send_multipart([b"", dumps_foreign(req())])
        while b.stats["received"] < 1:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # planning, in a worker thread that will not finish
        b.stop()
        await serving
        answered = c.poll(2000)
        error = _error(c) if answered else None
        release.set()  # the stuck planning thread ends now: asyncio.run's exit joins it (30 s otherwise)
        b.close()
        c.close()
        return answered, error

    try:
        answered, error = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        release.set()
    assert answered, "a request still being planned at shutdown was never answered"
    assert "shutting down" in (error or "")
