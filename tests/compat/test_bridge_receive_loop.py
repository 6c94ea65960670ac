"""The bridge's receive loop survives whatever a small payload decodes to: a message that only looks
like a ping, or a warmup whose flag is not a plain value, gets an answer, and the bridge keeps serving."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest
import zmq

from candidate_scheduler.compat import bridge as bridge_mod
from candidate_scheduler.compat.classify import Answer, classify
from candidate_scheduler.compat.foreign import ForeignObject, dumps_foreign
from candidate_scheduler.compat.sglang_classes import SCHEDULE_BATCH
from candidate_scheduler.compat.unpickle import safe_loads
from tests.conftest import free_port
from tests.unit.test_sglang_compat import req

pytestmark = pytest.mark.timeout(120)

ARRAY = np.array([1, 2], dtype=np.int8)  # its truth value raises


def _hostile_payloads() -> list[bytes]:
    # a bare Req: small enough to be decoded and classified inside the receive loop itself
    small_req = ForeignObject(SCHEDULE_BATCH, "Req", {"extra": {"server_internal_prewarm": ARRAY}})
    payloads = [pickle.dumps({"method": ARRAY}, protocol=4), dumps_foreign(small_req)]
    assert all(len(p) <= bridge_mod.INLINE_DECODE_BYTES for p in payloads)
    return payloads


def test_classify_never_raises_on_values_without_a_truth_value():
    assert isinstance(classify(safe_loads(pickle.dumps({"method": ARRAY}))), Answer)
    assert isinstance(classify(safe_loads(pickle.dumps({"method": ARRAY, "x": 1}))), Answer)
    # a warmup flag that is not a plain value is not a warmup: the Req is a generation like any other
    msg = classify(safe_loads(dumps_foreign(req(extra={"server_internal_prewarm": ARRAY}))))
    assert not isinstance(msg, Answer) or "Unknown" not in msg.error


@pytest.mark.parametrize("which", [0, 1])
def test_a_small_payload_that_breaks_classify_is_answered_and_the_bridge_keeps_serving(which):
    payload = _hostile_payloads()[which]

    async def main():
        dead = f"tcp://127.0.0.1:{free_port()}"
        b = bridge_mod.Bridge(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=dead,
                                                      request_timeout_s=0.5))
        endpoint = b.bind()
        serving = asyncio.create_task(b.serve())
        c = zmq.Context.instance().socket(zmq.DEALER)
        c.setsockopt(zmq.LINGER, 0)
        c.connect(endpoint)

        async def reply(timeout_s: float):
            deadline = asyncio.get_running_loop().time() + timeout_s
            while not c.poll(0):
                if asyncio.get_running_loop().time() > deadline:
                    return None
                await asyncio.sleep(0.02)
            return safe_loads(c.recv_multipart()[-1])

        try:
            c.send_multipart([b"", payload])
            first = await reply(10)
            c.send_multipart([b"", pickle.dumps({"method": "ping"})])
            ping = await reply(5)
        finally:
            b.stop()
            await serving
            b.close()
            c.close()
        return first, ping

    first, ping = asyncio.run(asyncio.wait_for(main(), 60))
    assert first is not None, "a small hostile payload was never answered"
    assert first.__dict__.get("error"), "it must be answered with an error"
    assert ping is not None, "the bridge stopped answering after one small hostile payload"
    assert ping.__dict__.get("error") is None


def test_a_loop_that_dies_ends_the_bridge_with_its_error_instead_of_a_silent_bridge(monkeypatch):
    async def broken(self):
        await asyncio.sleep(0.05)
        raise OSError("the socket went away")

    monkeypatch.setattr(bridge_mod.Bridge, "_recv_clients", broken)

    async def main():
        dead = f"tcp://127.0.0.1:{free_port()}"
        b = bridge_mod.Bridge(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=dead))
        b.bind()
        try:
            with pytest.raises(RuntimeError, match="receive loop ended: OSError: the socket went away"):
                await asyncio.wait_for(b.serve(), 10)
        finally:
            b.close()

    asyncio.run(main())
