"""While a request waits on the scheduler, the bridge holds its observations (counted against
`max_held_bytes`) and nothing else of it: the decoded Req (its pickled image: as many bytes again) is
dropped once planned. It stayed referenced by the request's task until the answer came, so a bridge at its
byte budget held about twice what it counted."""

from __future__ import annotations

import asyncio
import gc
import weakref

import zmq

from candidate_scheduler.compat import bridge as bridge_mod
from candidate_scheduler.compat.foreign import dumps_foreign
from candidate_scheduler.compat.unpickle import PILImageStub, safe_loads
from tests.conftest import free_port
from tests.unit.test_sglang_compat import req


def test_a_forwarded_request_does_not_keep_its_decoded_req(monkeypatch):
    decoded: list[weakref.ref] = []
    real_plan = bridge_mod.plan_generation

    def spy(reqs):
        assert isinstance(reqs[0].image_path, PILImageStub)  # the observation's pixels, as pickled
        decoded.append(weakref.ref(reqs[0]))
        return real_plan(reqs)

    monkeypatch.setattr(bridge_mod, "plan_generation", spy)

    async def main():
        dead = f"tcp://127.0.0.1:{free_port()}"  # no scheduler: the request waits there until the bridge stops
        b = bridge_mod.Bridge(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=dead))
        endpoint = b.bind()
        serving = asyncio.create_task(b.serve())
        c = zmq.Context.instance().socket(zmq.DEALER)
        c.setsockopt(zmq.LINGER, 0)
        c.connect(endpoint)
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
