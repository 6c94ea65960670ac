"""AsyncClient closed while its calls wait on a scheduler that does not answer (some of them cancelled
first, as the openpi front cancels a robot's call when it leaves): every waiter left gets ClientClosed,
and no task of the client is left with an exception nobody retrieved (asyncio would log "Task exception
was never retrieved" when it is collected)."""

from __future__ import annotations

import asyncio
import gc

import pytest
import zmq

from candidate_scheduler.service.async_client import AsyncClient, ClientClosed
from candidate_scheduler.service.client import make_request, synthetic_image


@pytest.mark.parametrize("cancel_first", [False, True])
def test_closing_a_client_whose_calls_wait_leaves_no_unretrieved_task_exception(cancel_first):
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # takes every message, answers none
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    unretrieved: list[dict] = []

    async def main() -> list:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unretrieved.append(context))
        client = AsyncClient(f"tcp://127.0.0.1:{port}", liveness_s=5.0)
        calls = [asyncio.ensure_future(client.submit_request(make_request(synthetic_image(), "pick", count=1,
                                                                          request_id=f"g{i}")))
                 for i in range(3)]
        calls.append(asyncio.ensure_future(client.ping(5.0)))
        await asyncio.sleep(0.3)  # all waiting: on their liveness PING, or on a PONG
        if cancel_first:  # as the openpi front does when a robot leaves: its call is cancelled, not closed
            for call in calls[:2]:
                call.cancel()
            await asyncio.sleep(0.1)
        client.close()
        done = await asyncio.gather(*calls, return_exceptions=True)
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
        return done

    try:
        done = asyncio.run(main())
    finally:
        silent.close(0)
    gc.collect()
    assert all(isinstance(d, ClientClosed) for d in done[2 if cancel_first else 0:]), done
    assert not [c for c in unretrieved if "never retrieved" in c.get("message", "")], unretrieved


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()
