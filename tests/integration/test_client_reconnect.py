"""A connection that drops while groups are in flight (a network reset; here the scheduler's own socket
closing it on an over-size message, which clients now refuse to send): the scheduler answers the
connection a group came on, so the replies of every group in flight on it were lost, and the same run
kept answering PINGs, so nothing noticed -- an AsyncClient waited forever, a Client its whole timeout.
Each client now counts drops (a socket monitor) and sends what it awaits again, under its id, to the run
that still answers: it is answered once, from the group still running or the reply it kept."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import ConnectionDropped, make_request
from tests.conftest import wait_for
from tests.integration.test_scheduler import IMAGE, assert_single_reply, expected_candidates

STEPS = 20  # 20 steps of 50 ms: the group is running when the connection drops


def drop_the_connection(sock):
    """What no client sends any more (make_request refuses it): a message over the scheduler's limit,
    on which its socket closes the connection. (An asyncio socket's send is awaited.)"""
    return sock.send_multipart([protocol.header(protocol.Kind.SUBMIT), b"\0" * (protocol.MAX_MESSAGE_BYTES + 1)])


def fleet(services):
    sched = services.scheduler()
    services.worker(sched, "null", 4, 0.05)
    sched.wait_workers(1)
    return sched


def test_a_client_is_told_to_send_again_what_a_dropped_connection_was_to_answer(services):
    """A caller's own send and wait: ConnectionDropped (a SchedulerUnavailable: the resend it calls for is
    the one resubmission already is); sent again, it is answered once, having run once. A group sent after
    the drop is not concerned. (`Client.submit` sends it again itself: tests/unit/test_client_replies.py.)"""
    sched = fleet(services)
    with sched.client(liveness_s=0.5) as c:
        request = make_request(IMAGE, "pick", count=4, seed=3, steps=STEPS, return_candidates=True)
        c.send(request)
        wait_for(lambda: c.status(request.request_id).state == "running", 10, "the group to run")
        drop_the_connection(c._sock)
        wait_for(lambda: (c._count_drops(), c._drops)[1] >= 1, 10, "the client to see the drop")
        assert c.status(request.request_id).state == "running"  # its reply is still to come
        after = c.submit(IMAGE, "pick", count=2, seed=4, steps=2, return_candidates=True, timeout_s=30)
        assert after.status == "done" and after.resent == []
        with pytest.raises(ConnectionDropped):
            c.wait(request.request_id, timeout_s=30)
        again = c.wait(c.send(request), timeout_s=30)
        assert again.status == "done" and again.metrics["retries"] == 0  # it ran once, on its first send
        np.testing.assert_array_equal(again.candidates, expected_candidates(3, 4, steps=STEPS))
        assert_single_reply(c, request.request_id)


def test_an_async_client_sends_again_what_a_dropped_connection_was_to_answer(services):
    sched = fleet(services)

    async def scenario():
        c = AsyncClient(sched.request, control=sched.control, liveness_s=0.5)
        try:
            waiting = [asyncio.ensure_future(c.submit(IMAGE, "pick", count=2, seed=10 + i, steps=STEPS,
                                                      return_candidates=True, request_id=f"in-flight-{i}"))
                       for i in range(3)]
            await asyncio.sleep(0.3)
            await drop_the_connection(c._sock)
            return await asyncio.wait_for(asyncio.gather(*waiting), 30), c.unclaimed
        finally:
            c.close()

    results, unclaimed = asyncio.run(scenario())
    for i, r in enumerate(results):
        assert r.status == "done" and r.resent == ["reconnected"]
        np.testing.assert_array_equal(r.candidates, expected_candidates(10 + i, 2, steps=STEPS))
    assert unclaimed == 0


def test_an_async_client_takes_a_reply_that_came_before_the_drop_was_noticed(services):
    """The reply was already on its way in when a drop was seen (the loop was busy meanwhile): it is the
    group's answer. Before, the drop won, the reply was thrown away and the group sent again -- to run a
    second time once the scheduler's kept replies no longer hold it."""
    sched = fleet(services)

    async def scenario():
        c = AsyncClient(sched.request, control=sched.control, liveness_s=0.5)
        try:
            task = asyncio.ensure_future(c.submit(IMAGE, "pick", count=2, seed=21, steps=1, return_candidates=True))
            await asyncio.sleep(0.05)  # sent; its caller waits for the answer
            time.sleep(1.0)  # the loop is busy: the reply arrives, unread
            c._drops += 1  # and a drop is seen first, as the socket monitor's task reports it
            woken, c._next_drop = c._drop_future(), None
            woken.set_result(None)
            return await asyncio.wait_for(task, 30)
        finally:
            c.close()

    r = asyncio.run(scenario())
    assert r.status == "done" and r.resent == []
    np.testing.assert_array_equal(r.candidates, expected_candidates(21, 2, steps=1))
