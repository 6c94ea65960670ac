"""AsyncClient closed while a call is inside one of its sockets' own waits: a SUBMIT or PING whose send waits
for room in ZMQ's queue (the scheduler away, 1,000 messages queued), or a STATUS asked of the control
socket after a restart. Closing a pyzmq socket cancels the futures of those waits, and that cancellation
came out of `submit` and `ping` as a CancelledError nobody asked for (a front's robot task then looked
cancelled, and the future close() failed was logged "never retrieved"). Every such call raises
ClientClosed now; a call its caller cancels still ends cancelled."""

from __future__ import annotations

import asyncio
import gc
import socket

import numpy as np
import pytest
import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import ClientClosed
from tests.unit.test_client_replies import Played

IMAGE = np.zeros((8, 8, 3), np.uint8)
QUEUED = 1000  # a DEALER's send queue (SNDHWM): past it a send waits for the scheduler


def _nobody() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _never_retrieved(contexts: list[dict]) -> list[dict]:
    return [c for c in contexts if "never retrieved" in c.get("message", "")]


async def _answer_pings(control: zmq.asyncio.Socket, played: Played, asked: asyncio.Queue) -> None:
    """The scheduler's control socket: a PING answered at once (the client's liveness PINGs go there, with
    `played`'s run), anything else handed to the test in `asked` as (identity, delimited, kind)."""
    while True:
        identity, delimited, kind, payload = protocol.split_envelope(await control.recv_multipart(),
                                                                     protocol.CONTROL_KINDS)
        if kind is protocol.Kind.PING:
            pong = protocol.Pong(protocol.decode(kind, payload).nonce, incarnation=played.state["incarnation"])
            await control.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG, pong))
        else:
            asked.put_nowait((identity, delimited, kind))


def test_calls_waiting_to_send_when_the_client_closes_raise_client_closed():
    unretrieved: list[dict] = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unretrieved.append(context))
        c = AsyncClient(_nobody(), liveness_s=None)  # no liveness: each send waits for room, nothing else
        calls = [asyncio.ensure_future(c.submit(IMAGE, "pick", request_id=f"g{i}")) for i in range(QUEUED + 3)]
        await asyncio.sleep(0.2)  # 1,000 queued and awaiting their replies; 3 waiting to be sent
        blocked_ping = asyncio.ensure_future(c.ping(30))  # its PING waits for room too
        cancelled = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="cancelled-by-its-caller"))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        c.close()
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, blocked_ping, return_exceptions=True), 5)
        for _ in range(3):
            await asyncio.sleep(0)
        return {type(o).__name__ for o in outcomes}, cancelled.cancelled()

    kinds, caller_cancel_kept = asyncio.run(scenario())
    gc.collect()
    assert kinds == {"ClientClosed"}
    assert caller_cancel_kept  # a cancellation the caller asked for is still one
    assert not _never_retrieved(unretrieved), unretrieved


def test_a_submit_asking_status_after_a_restart_when_the_client_closes_raises_client_closed():
    """The scheduler restarts with `g` in flight (its connection drops, run B answers the PING): the
    client asks the control socket whether B holds `g`, and is closed while that STATUS waits."""

    def answer(msg, state):
        state["drop"], state["incarnation"] = True, "B"
        return []

    played = Played(answer)

    async def scenario():
        ctx = zmq.asyncio.Context.instance()
        control = ctx.socket(zmq.ROUTER)  # answers PINGs; takes the STATUS, never answers it
        control.setsockopt(zmq.LINGER, 0)
        port = control.bind_to_random_port("tcp://127.0.0.1")
        asked: asyncio.Queue = asyncio.Queue()
        server = asyncio.ensure_future(_answer_pings(control, played, asked))
        c = AsyncClient(played.endpoint, liveness_s=2.0, control=f"tcp://127.0.0.1:{port}")
        try:
            call = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="g"))
            _ident, _delimited, kind = await asyncio.wait_for(asked.get(), 5)
            assert kind is protocol.Kind.STATUS
            c.close()
            done, _ = await asyncio.wait({call}, timeout=5)
            assert call in done, "still waiting after close()"
            return call.cancelled() or call.exception()
        finally:
            server.cancel()
            c.close()
            control.close(0)

    try:
        outcome = asyncio.run(scenario())
    finally:
        played.close()
    assert isinstance(outcome, ClientClosed), outcome


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()


def test_a_submit_queued_for_the_control_link_when_the_client_closes_raises_client_closed():
    """Two groups lost to the same restart both ask STATUS; the link asks one at a time. Closed while the
    first asks: the second, queued for the link, opened a new control socket after close(), asked on it,
    kept it open once answered, and reported SchedulerUnavailable ("restarted") for a client its caller
    had closed."""

    def answer(msg, state):
        if len(state["submits"]) == 2:  # both in flight: the scheduler restarts
            state["drop"], state["incarnation"] = True, "B"
        return []

    played = Played(answer)

    async def scenario():
        ctx = zmq.asyncio.Context.instance()
        control = ctx.socket(zmq.ROUTER)
        control.setsockopt(zmq.LINGER, 0)
        port = control.bind_to_random_port("tcp://127.0.0.1")
        c = AsyncClient(played.endpoint, liveness_s=2.0, control=f"tcp://127.0.0.1:{port}")

        async def answer_status_unknown():  # what asks come after close() are answered: B does not hold them
            while True:
                identity, delimited, _kind = await asked.get()
                await control.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY,
                                                                   protocol.ControlReply(True, state="unknown")))

        asked: asyncio.Queue = asyncio.Queue()
        pings = asyncio.ensure_future(_answer_pings(control, played, asked))
        server = None
        try:
            calls = [asyncio.ensure_future(c.submit(IMAGE, "pick", request_id=f"g{i}")) for i in range(2)]
            first = await asyncio.wait_for(asked.get(), 5)  # the first STATUS; the second waits its turn
            assert first[2] is protocol.Kind.STATUS
            await asyncio.sleep(0.05)
            c.close()
            server = asyncio.ensure_future(answer_status_unknown())
            done, _ = await asyncio.wait(set(calls), timeout=5)
            assert len(done) == 2, "still waiting after close()"
            return [call.cancelled() or call.exception() for call in calls], c.control._sock
        finally:
            for task in (pings, server):
                if task is not None:
                    task.cancel()
            c.close()
            control.close(0)

    try:
        outcomes, control_socket = asyncio.run(scenario())
    finally:
        played.close()
    assert all(isinstance(o, ClientClosed) for o in outcomes), outcomes
    assert control_socket is None  # no socket opened after close()


def test_an_ask_of_a_control_link_closed_meanwhile_raises_client_closed():
    """The openpi front asks the link itself (STATS, CANCEL): an ask in flight, or waiting its turn, when
    the link is closed raises ClientClosed, not a cancellation its caller never asked for."""
    from candidate_scheduler.service.control_link import ControlLink

    async def scenario():
        ctx = zmq.asyncio.Context.instance()
        control = ctx.socket(zmq.ROUTER)  # takes every request, answers none
        control.setsockopt(zmq.LINGER, 0)
        link = ControlLink(ctx, f"tcp://127.0.0.1:{control.bind_to_random_port('tcp://127.0.0.1')}")
        try:
            asks = [asyncio.ensure_future(link.ask(protocol.Kind.STATS, protocol.Empty(), 5.0)) for _ in range(2)]
            await asyncio.wait_for(control.recv_multipart(), 5)  # the first is asked; the second waits its turn
            link.close()
            done, _ = await asyncio.wait(set(asks), timeout=5)
            assert len(done) == 2, "still waiting after close()"
            return [a.cancelled() or a.exception() for a in asks]
        finally:
            link.close()
            control.close(0)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, ClientClosed) for o in outcomes), outcomes


@pytest.mark.parametrize("with_control", [False, True])
def test_a_call_closed_before_its_first_send_raises_client_closed(with_control):
    """close() right after a submit started, before its first PING was sent: that send then ran on a closed
    socket and raised ZMQError (a front answered its robot "internal error" and logged a traceback)."""

    async def scenario():
        c = AsyncClient(_nobody(), control=_nobody() if with_control else None, liveness_s=1.0)
        call = asyncio.ensure_future(c.submit(IMAGE, "pick"))
        await asyncio.sleep(0)  # started: its liveness PING is about to be sent
        c.close()
        with pytest.raises(ClientClosed):
            await asyncio.wait_for(call, 5)

    asyncio.run(scenario())
