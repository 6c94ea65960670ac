"""The asyncio control link (service/control_link.py): a request cancelled while its reply is still to
come must never have that reply read as the answer to the next request."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.control_link import ControlLink


def test_a_cancelled_ask_never_lends_its_late_reply_to_the_next_one():
    async def run() -> tuple[str | None, str | None]:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = ControlLink(ctx, f"tcp://127.0.0.1:{port}")

        async def answer(state: str) -> None:  # a slow scheduler: reads one request, answers it when told
            identity, delimited, _kind, _payload = protocol.split_envelope(await router.recv_multipart(),
                                                                            protocol.CONTROL_KINDS)
            await router.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY,
                                                              protocol.ControlReply(True, state=state)))

        first = asyncio.ensure_future(link.ask(protocol.Kind.STATUS, protocol.StatusRequest("a"), 5.0))
        await asyncio.sleep(0.2)
        first.cancel()  # e.g. the openpi front gives up on a robot that disconnected
        await asyncio.gather(first, return_exceptions=True)
        await answer("reply-to-the-cancelled-status")  # its late reply arrives after all
        second = asyncio.ensure_future(link.ask(protocol.Kind.STATUS, protocol.StatusRequest("b"), 5.0))
        await answer("reply-to-the-second")
        reply = await second
        third = asyncio.ensure_future(link.ask(protocol.Kind.STATUS, protocol.StatusRequest("c"), 5.0))
        await answer("reply-to-the-third")
        after = await third
        link.close()
        router.close(0)
        ctx.term()
        return reply.state, after.state

    assert asyncio.run(run()) == ("reply-to-the-second", "reply-to-the-third")
