"""PingLink (service/control_link.py): AsyncClient's PINGs on the control socket, many in flight on one
socket. Each PING takes the PONG that names its nonce, whatever the order they come in; one unanswered
in time is None; a PING waiting when the link is closed raises ClientClosed."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.control_link import PingLink
from candidate_scheduler.service.replies import ClientClosed


async def _pings_read(router: zmq.asyncio.Socket, n: int) -> list[tuple[bytes, bytes, int]]:
    read = []
    for _ in range(n):
        identity, delimited, kind, payload = protocol.split_envelope(await router.recv_multipart(),
                                                                     protocol.CONTROL_KINDS)
        assert kind is protocol.Kind.PING
        read.append((identity, delimited, protocol.decode(kind, payload).nonce))
    return read


def _pong(identity: bytes, delimited: bytes, nonce: int, incarnation: str) -> list[bytes]:
    return protocol.reply_frames(identity, delimited, protocol.Kind.PONG, protocol.Pong(nonce, incarnation=incarnation))


def test_each_ping_takes_its_own_pong_whatever_the_order():
    async def scenario():
        ctx = zmq.asyncio.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        link = PingLink(ctx, f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")
        try:
            pings = [asyncio.ensure_future(link.ping(5.0)) for _ in range(3)]
            read = await asyncio.wait_for(_pings_read(router, 3), 5)
            for i, (identity, delimited, nonce) in reversed(list(enumerate(read))):  # answered last first
                await router.send_multipart(_pong(identity, delimited, nonce, f"answer-to-{i}"))
            pongs = await asyncio.wait_for(asyncio.gather(*pings), 5)
            return [p.incarnation for p in pongs], [nonce for _i, _d, nonce in read], [p.nonce for p in pongs]
        finally:
            link.close()
            router.close(0)

    incarnations, sent, answered = asyncio.run(scenario())
    assert incarnations == ["answer-to-0", "answer-to-1", "answer-to-2"] and sent == answered


def test_an_unanswered_ping_is_none_and_a_waiting_one_raises_client_closed_when_the_link_closes():
    async def scenario():
        ctx = zmq.asyncio.Context.instance()
        router = ctx.socket(zmq.ROUTER)  # reads every PING, answers none
        router.setsockopt(zmq.LINGER, 0)
        link = PingLink(ctx, f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")
        try:
            unanswered = await link.ping(0.05)
            waiting = asyncio.ensure_future(link.ping(5.0))
            while (await asyncio.wait_for(_pings_read(router, 1), 5))[0][2] != 2:  # this one is read (the one
                pass  # that timed out may be, or may have gone with its socket)
            link.close()
            done, _ = await asyncio.wait({waiting}, timeout=5)
            assert waiting in done, "still waiting after close()"
            with pytest.raises(ClientClosed):
                await link.ping(1.0)
            return unanswered, waiting.exception()
        finally:
            link.close()
            router.close(0)

    unanswered, outcome = asyncio.run(scenario())
    assert unanswered is None and isinstance(outcome, ClientClosed), outcome
