"""The bytes the bridge holds for requests (payloads waiting to be decoded, observations waiting on the
scheduler) are bounded, not just their number: past `max_held_bytes` a request is answered "busy" at
once, and one request alone is always taken."""

from __future__ import annotations

import asyncio
import gc
import pickle
import threading
import weakref

import pytest
import zmq

from candidate_scheduler.compat import bridge as bridge_mod
from candidate_scheduler.compat.foreign import dumps_foreign
from candidate_scheduler.compat.unpickle import PILImageStub, safe_loads
from tests.conftest import free_port
from tests.unit.test_sglang_compat import req

pytestmark = pytest.mark.timeout(120)


def _run(config_kwargs: dict, payloads: list[bytes], monkeypatch) -> tuple[list, int]:
    release = threading.Event()
    monkeypatch.setattr(bridge_mod, "plan_generation", lambda reqs: release.wait(20) and None)

    async def main():
        b, serving, c = _serving_bridge(**config_kwargs)
        errors = []
        try:
            for p in payloads:
                c.send_multipart([b"", p])
            while b.stats["received"] < len(payloads):
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            while c.poll(0):
                errors.append(safe_loads(c.recv_multipart()[-1]).__dict__.get("error"))
            held = len(b._tasks)
            c.send_multipart([b"", pickle.dumps({"method": "ping"})])
            while not c.poll(0):
                await asyncio.sleep(0.02)
            errors.append(safe_loads(c.recv_multipart()[-1]).__dict__.get("error"))
            release.set()
            while b._tasks:  # every request answered: nothing stays counted
                await asyncio.sleep(0.02)
            assert b._held_bytes == 0
        finally:
            release.set()
            b.stop()
            await serving
            b.close()
            c.close()
        return errors, held

    try:
        return asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        release.set()


def test_requests_past_the_byte_budget_are_answered_busy(monkeypatch):
    payload = dumps_foreign(req())  # ~13 KB: decoded off the receive loop, then held while planning
    budget = int(len(payload) * 2.5)
    errors, held = _run({"max_held_bytes": budget}, [payload] * 6, monkeypatch)
    *refused, ping = errors
    assert held == 2, f"{held} requests held with a budget of 2.5 requests' bytes"
    assert len(refused) == 4 and all("busy" in (e or "") for e in refused), refused
    assert ping is None


def test_one_request_over_the_budget_alone_is_still_taken(monkeypatch):
    payload = dumps_foreign(req())
    errors, held = _run({"max_held_bytes": len(payload) // 2}, [payload], monkeypatch)
    assert held == 1 and errors == [None]


def test_the_default_budget_is_well_below_max_in_flight_full_size_payloads():
    cfg = bridge_mod.BridgeConfig()
    assert cfg.max_held_bytes < cfg.max_in_flight * cfg.max_message_bytes // 8
    assert cfg.max_held_bytes >= 4 * cfg.max_message_bytes  # several full-size requests at once
    args = bridge_mod.build_parser().parse_args(["--max-held-bytes", "1000000"])
    assert args.max_held_bytes == 1_000_000


def test_a_forwarded_request_counts_its_observations_until_it_is_answered():
    payload = dumps_foreign(req())  # a 64x64 RGB observation: 12288 bytes once decoded

    async def main():
        b, serving, c = _serving_bridge(request_timeout_s=1.5)
        try:
            c.send_multipart([b"", payload])
            c.send_multipart([b"", payload])
            while b.stats["forwarded"] < 2:
                await asyncio.sleep(0.02)
            waiting = b._held_bytes
            while b._tasks:
                await asyncio.sleep(0.02)
            return waiting, b._held_bytes, [safe_loads(c.recv_multipart()[-1]).__dict__.get("error")
                                            for _ in range(2)]
        finally:
            b.stop()
            await serving
            b.close()
            c.close()

    waiting, after, errors = asyncio.run(asyncio.wait_for(main(), 60))
    assert waiting == 2 * 64 * 64 * 3
    assert after == 0
    assert all("no result within" in (e or "") for e in errors), errors


def _serving_bridge(**config) -> tuple[bridge_mod.Bridge, asyncio.Task, zmq.Socket]:
    """A bridge serving (in the running loop) for a scheduler that never answers (nobody listens there),
    and a DEALER connected to it, as sglang's client is."""
    dead = f"tcp://127.0.0.1:{free_port()}"
    b = bridge_mod.Bridge(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=dead, **config))
    endpoint = b.bind()
    serving = asyncio.create_task(b.serve())
    c = zmq.Context.instance().socket(zmq.DEALER)
    c.setsockopt(zmq.LINGER, 0)
    c.connect(endpoint)
    return b, serving, c


def test_a_forwarded_request_does_not_keep_its_decoded_req(monkeypatch):
    """While a request waits on the scheduler, the bridge holds its observations (counted against
    `max_held_bytes`) and nothing else of it: the decoded Req (its pickled image: as many bytes again) is
    dropped once planned. It stayed referenced by the request's task until the answer came, so a bridge at
    its byte budget held about twice what it counted."""
    decoded: list[weakref.ref] = []
    real_plan = bridge_mod.plan_generation

    def spy(reqs):
        assert isinstance(reqs[0].image_path, PILImageStub)  # the observation's pixels, as pickled
        decoded.append(weakref.ref(reqs[0]))
        return real_plan(reqs)

    monkeypatch.setattr(bridge_mod, "plan_generation", spy)

    async def main():
        b, serving, c = _serving_bridge()  # no scheduler: the request waits there until the bridge stops
        try:
            c.send_multipart([b"", dumps_foreign(req())])
            for _ in range(500):
                if b.stats["forwarded"]:
                    break
                await asyncio.sleep(0.02)
            assert b.stats["forwarded"] == 1 and len(b._tasks) == 1
            gc.collect()
            alive = decoded[0]() is not None
            held = b._held_bytes
        finally:
            b.stop()
            await serving
            b.close()
        # the request is still answered (by the shutdown), exactly once
        assert c.poll(5000)
        error = safe_loads(c.recv_multipart()[-1]).__dict__.get("error")
        c.close()
        return alive, held, error

    alive, held, error = asyncio.run(asyncio.wait_for(main(), 60))
    assert held == 64 * 64 * 3  # what is counted: the observation the group is sent (and resent) with
    assert not alive, "the decoded Req is still held while its group waits on the scheduler"
    assert "shutting down" in (error or "")
