"""A reply the client cannot read (a scheduler of another version: a field of another type) fails the
group it names, and only that one, against a scheduler the test plays (tests/unit/test_client_replies.py's
`Played`): the AsyncClient skipped it and its waiter waited forever (the scheduler, alive, answers every
PING); the blocking Client raised it from whichever wait read it."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import Client, make_request
from tests.unit.test_client_replies import Played, result

IMAGE = np.zeros((8, 8, 3), np.uint8)


def answer(msg, state):
    if msg.request_id == "unreadable":  # msgspec checks types when it decodes: this one travels
        return [(protocol.Kind.RESULT, protocol.GroupResult(request_id=msg.request_id, status=5))]
    time.sleep(0.1)
    return [(protocol.Kind.RESULT, result(msg.request_id))]


def test_an_async_waiter_is_told_its_reply_could_not_be_read():
    played = Played(answer)

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=0.2)
        try:
            other = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="other"))
            with pytest.raises(protocol.ProtocolError, match="unreadable"):
                await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="unreadable"), 3)
            return (await asyncio.wait_for(other, 3)).ok, dict(c._futures)
        finally:
            c.close()

    try:
        assert asyncio.run(scenario()) == (True, {})
    finally:
        played.close()


def test_a_blocking_wait_is_not_failed_for_another_groups_unreadable_reply():
    played = Played(answer)
    try:
        with Client(played.endpoint, liveness_s=0.5) as c:
            c.send(make_request(IMAGE, "pick", request_id="unreadable"))
            c.send(make_request(IMAGE, "pick", request_id="other"))
            assert c.wait("other", 3).ok
            with pytest.raises(protocol.ProtocolError, match="unreadable"):
                c.wait("unreadable", 3)
            assert c._pending == {} and c._sent_to == {}
    finally:
        played.close()
