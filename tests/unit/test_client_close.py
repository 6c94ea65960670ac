"""Closing a client twice (an explicit close() inside a `with` block) is harmless, and a blocking Client
used after close raises ClientClosed, not a bare ZMQError about a socket that is no more."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import Client, ClientClosed

ENDPOINT = "tcp://127.0.0.1:9"  # nobody is reached: nothing here waits for an answer


def test_a_client_closed_twice_raises_nothing():
    with Client(ENDPOINT, ENDPOINT) as c:
        c.close()  # and __exit__ closes it again


def test_an_async_client_closed_twice_raises_nothing():
    async def scenario():
        c = AsyncClient(ENDPOINT, control=ENDPOINT)
        c.close()
        c.close()

    asyncio.run(scenario())


def test_a_closed_client_says_so():
    c = Client(ENDPOINT, ENDPOINT, liveness_s=None)
    c.close()
    with pytest.raises(ClientClosed):
        c.submit(np.zeros((8, 8, 3), np.uint8), "pick", timeout_s=1, resubmit=True)
    with pytest.raises(ClientClosed):
        c.wait("g", 1)
    with pytest.raises(ClientClosed):
        c.ping(1)
    with pytest.raises(ClientClosed):
        c.status("g")
