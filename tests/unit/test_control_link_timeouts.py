"""The asyncio control link keeps to each caller's timeout: it asks one request at a time, and with the
scheduler away each ask waits out its timeout, so a caller queued behind others must not wait theirs too
(the openpi front cancels the group of every robot that disconnects through one link)."""

from __future__ import annotations

import asyncio
import time

import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.service.control_link import ControlLink


def test_callers_queued_for_the_link_are_not_kept_past_their_own_timeout():
    async def run() -> list[tuple[object, float]]:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)  # a scheduler that takes requests and never answers (paused)
        router.setsockopt(zmq.LINGER, 0)
        link = ControlLink(ctx, f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")

        async def timed(rid: str) -> tuple[object, float]:
            started = time.monotonic()
            reply = await link.ask(protocol.Kind.CANCEL, protocol.CancelRequest(rid), 0.3)
            return reply, time.monotonic() - started

        try:
            return await asyncio.wait_for(asyncio.gather(*(timed(f"g{i}") for i in range(5))), 10)
        finally:
            link.close()
            router.close(0)
            ctx.term()

    outcomes = asyncio.run(run())
    assert [reply for reply, _ in outcomes] == [None] * 5
    assert max(took for _, took in outcomes) < 0.75, outcomes  # the fifth waited 5 x 0.3 s


def test_the_link_still_answers_after_callers_gave_up_on_it():
    """Callers that gave up while queued leave the link usable: the next ask gets its own reply."""

    async def run() -> str | None:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        link = ControlLink(ctx, f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")
        try:
            await asyncio.gather(*(link.ask(protocol.Kind.STATUS, protocol.StatusRequest(f"g{i}"), 0.2)
                                   for i in range(3)))
            while await router.poll(50):  # what the paused scheduler was sent meanwhile: never answered
                await router.recv_multipart()
            asked = asyncio.ensure_future(link.ask(protocol.Kind.STATUS, protocol.StatusRequest("next"), 5.0))
            identity, delimited, _kind, payload = protocol.split_envelope(await router.recv_multipart(),
                                                                          protocol.CONTROL_KINDS)
            rid = protocol.decode(protocol.Kind.STATUS, payload).request_id
            await router.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY,
                                                              protocol.ControlReply(True, state=rid)))
            reply = await asyncio.wait_for(asked, 5)
            return reply.state
        finally:
            link.close()
            router.close(0)
            ctx.term()

    assert asyncio.run(run()) == "next"


def test_a_caller_cancelled_while_waiting_its_turn_leaves_the_link_usable():
    """A caller cancelled (its robot left) while it waited for the link must not keep the lock: every
    later ask would then wait out its timeout for nothing."""
    import asyncio

    import zmq.asyncio

    from candidate_scheduler import protocol
    from candidate_scheduler.service.control_link import ControlLink

    async def main():
        ctx = zmq.asyncio.Context.instance()
        link = ControlLink(ctx, "tcp://127.0.0.1:9")  # nothing there: an ask waits out its timeout
        first = asyncio.ensure_future(link.ask(protocol.Kind.PING, protocol.Ping(1), 0.3))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(link.ask(protocol.Kind.PING, protocol.Ping(2), 5.0))
        await asyncio.sleep(0.05)
        waiting.cancel()
        assert await first is None
        await asyncio.sleep(0.05)
        assert not link._lock.locked()
        link.close()

    asyncio.run(main())
