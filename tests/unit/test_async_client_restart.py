"""AsyncClient across its scheduler's first PING and a restart, against a scheduler the test plays
(tests/unit/test_client_replies.py's `Played`): one id is taken once even when two submissions of it race
past the first PING, and a group lost to a restart is given up while other groups keep being answered."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import SchedulerUnavailable
from tests.unit.test_client_replies import Played, result

IMAGE = np.zeros((8, 8, 3), np.uint8)


def test_two_submissions_of_one_id_racing_past_the_first_ping_are_not_both_taken():
    """Both submissions await the client's first PING before registering: the second overwrote the first's
    future, which then waited forever (the scheduler, alive, answers every PING). Now it is refused."""

    def answer(msg, state):
        time.sleep(0.05)
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=0.2)
        try:
            calls = [c.submit(IMAGE, "pick", request_id="same") for _ in range(2)]
            outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
            return sorted(type(o).__name__ for o in outcomes), dict(c._futures)
        finally:
            c.close()

    try:
        assert asyncio.run(scenario()) == (["Result", "ValueError"], {})
    finally:
        played.close()


def test_a_group_lost_to_a_restart_is_given_up_while_other_groups_are_answered():
    """The scheduler restarts (its connection drops, run B answers on the same address) with group `lost`
    in flight, while another caller keeps submitting and B keeps answering. The PING after the drop says
    B: `lost` is given up then. It waited for a silence that never came, forever."""

    def answer(msg, state):
        if msg.request_id == "lost":
            state["drop"], state["incarnation"] = True, "B"  # restarted: A's groups are gone
            return []
        time.sleep(0.02)
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=0.3)
        stop = asyncio.Event()

        async def traffic():  # robots behind a front: a new group every 50 ms, whatever became of the last
            calls = []
            while not stop.is_set():
                calls.append(asyncio.ensure_future(c.submit(IMAGE, "pick", request_id=f"other-{len(calls)}")))
                await asyncio.sleep(0.05)
            await asyncio.gather(*calls, return_exceptions=True)

        try:
            await c.ping(1)
            other = asyncio.ensure_future(traffic())
            await asyncio.sleep(0.1)
            started = time.monotonic()
            with pytest.raises(SchedulerUnavailable, match="restarted"):
                await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="lost"), 5)
            stop.set()
            await asyncio.wait_for(other, 3)
            return time.monotonic() - started
        finally:
            c.close()

    try:
        assert asyncio.run(scenario()) < 3 * 0.3 + 0.5
    finally:
        played.close()
