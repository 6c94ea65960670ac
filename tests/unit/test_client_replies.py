"""What a client keeps and what it is told, against a scheduler the test plays (a ROUTER socket in a
thread): a reply is kept only while its group is awaited, so a second answer to one submit (a resend to a
run that was only paused, or a SUBMIT ZMQ queued while the scheduler was down) is neither held forever
nor taken as the answer to the next send; a closed AsyncClient fails its waiters; a request the scheduler
could not read fails before it is sent."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import Client, ClientClosed, ServiceError, make_request
from candidate_scheduler.service.requests import submit_frames

IMAGE = np.zeros((8, 8, 3), np.uint8)


def result(rid: str, status: str = "done", code: str | None = None) -> protocol.GroupResult:
    return protocol.GroupResult(request_id=rid, status=status, error_code=code)


class Played:
    """A scheduler the test plays: `answer(ident, kind, msg, state)` returns the replies to send; PINGs are
    answered PONG with `state["incarnation"]` unless `state["mute"]`."""

    def __init__(self, answer):
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.state = {"incarnation": "A", "mute": False, "submits": []}
        self._answer, self._stop = answer, threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.state.pop("drop", False):  # the connection drops; the same run listens again at once
                self.router.close(0)
                self.router = self.ctx.socket(zmq.ROUTER)
                self.router.setsockopt(zmq.LINGER, 0)
                for _ in range(100):  # ZMQ closes the old listener on its own thread, a moment later
                    try:
                        self.router.bind(self.endpoint)
                        break
                    except zmq.ZMQError:
                        time.sleep(0.01)
            if not self.router.poll(20):
                continue
            ident, header, payload = self.router.recv_multipart()
            kind = protocol.parse_header(header, protocol.REQUEST_KINDS)
            msg = protocol.decode(kind, payload)
            if kind is protocol.Kind.PING:
                if not self.state["mute"]:
                    pong = protocol.Pong(msg.nonce, incarnation=self.state["incarnation"])
                    self.router.send_multipart([ident, *protocol.encode(protocol.Kind.PONG, pong)])
                continue
            self.state["submits"].append((self.state["incarnation"], msg.request_id))
            for reply_kind, reply in self._answer(msg, self.state):
                self.router.send_multipart([ident, *protocol.encode(reply_kind, reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.router.close(0)


@pytest.mark.parametrize("with_control", [False, True])
def test_a_second_answer_from_a_stopping_run_is_not_taken_as_the_next_runs(with_control):
    """Run A, paused past the liveness verdict, gets the group and its resend, then stops with grace 0 and
    answers both `shutting_down`. The client takes the first, waits for the next run (B), resends: its answer
    is B's `done`, not A's second `shutting_down` (which had been kept, and read as B's). With a control
    endpoint the PINGs go there, so A's second answer was still unread on the request socket when the
    client resent, and was taken as B's: the client waited for a run after B until its timeout."""

    def answer(msg, state):
        n = len(state["submits"])
        if n == 1:
            state["mute"] = True  # paused: PINGs go unanswered, the client gives up on it
            time.sleep(0.6)
            state["mute"] = False
            return []
        if n == 2:  # the resend reached the same run, which now stops: both SUBMITs answered
            state["incarnation"] = "B"  # and the next run is up on the same address
            return [(protocol.Kind.RESULT, result(msg.request_id, "failed", "shutting_down"))] * 2
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)
    try:
        with Client(played.endpoint, played.endpoint if with_control else None, liveness_s=0.2) as c:
            r = c.submit(IMAGE, "pick", request_id="g", resubmit=True, timeout_s=10)
            assert (r.status, r.resent) == ("done", ["unavailable", "shutting_down"]), played.state["submits"]
            assert c.ping(1) and c._pending == {} and c._sent_to == {}
    finally:
        played.close()


def test_submit_sends_again_what_a_dropped_connection_was_to_answer():
    """The connection drops with the group in flight and the same run answers the PING after it: its reply
    would have gone to the closed connection, so submit sends the group again, under its id, and takes the
    one answer (`resent`: "reconnected"). Without the drop count it waited out its timeout."""

    def answer(msg, state):
        if len(state["submits"]) == 1:
            state["drop"] = True
            return []
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)
    try:
        with Client(played.endpoint, liveness_s=0.5) as c:
            r = c.submit(IMAGE, "pick", request_id="g", timeout_s=10)
            assert (r.status, r.resent) == ("done", ["reconnected"])
            assert played.state["submits"] == [("A", "g"), ("A", "g")] and c.unclaimed == 0
    finally:
        played.close()


def test_a_reply_after_its_submit_gave_up_is_not_kept():
    """submit(timeout_s) raises TimeoutError; the reply that comes after it has no taker and is dropped
    (it was kept under an id the caller may never have seen, one per timeout, forever)."""

    def answer(msg, state):
        time.sleep(0.15)
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)
    try:
        with Client(played.endpoint, liveness_s=None) as c:
            for i in range(3):
                with pytest.raises(TimeoutError):
                    c.submit(IMAGE, "pick", request_id=f"late-{i}", timeout_s=0.05)
            time.sleep(0.3)
            assert c.ping(1) and c._pending == {} and c._sent_to == {}
            assert c.submit(IMAGE, "pick", request_id="on-time", timeout_s=5).ok  # the client still works
    finally:
        played.close()


def test_an_error_naming_a_group_is_raised_by_that_groups_wait_only():
    """send(A), send(B), wait(A): B's ERROR (it names B) is B's wait's, not A's."""

    def answer(msg, state):
        if msg.request_id == "B":
            return [(protocol.Kind.ERROR, protocol.ErrorReply("unreadable", "bad_type", request_id="B"))]
        time.sleep(0.1)
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)
    try:
        with Client(played.endpoint, liveness_s=None) as c:
            c.send(make_request(IMAGE, "pick", request_id="A"))
            c.send(make_request(IMAGE, "pick", request_id="B"))
            assert c.wait("A", 5).ok
            with pytest.raises(ServiceError, match="bad_type"):
                c.wait("B", 5)
    finally:
        played.close()


def test_a_request_the_scheduler_could_not_read_fails_before_it_is_sent():
    with pytest.raises(ValueError, match=r"sampling\.height"):
        make_request(IMAGE, "pick", height=64.0)  # msgspec checks types when it decodes, not when it builds
    huge = make_request(np.zeros((1, 1, 3), np.uint8), "pick")
    huge = protocol.SubmitRequest(**{**{f: getattr(huge, f) for f in huge.__struct_fields__},
                                     "prompt": "x" * (protocol.MAX_MESSAGE_BYTES + 1)})
    with pytest.raises(ValueError, match="over the scheduler's limit"):  # its socket would drop the link
        submit_frames(huge)


# ---- AsyncClient ------------------------------------------------------------------------------------------


def test_async_waiters_cancelled_by_their_caller_leave_nothing_behind():
    """Bounded by asyncio.wait_for (the documented way) against a scheduler that never answers: every
    cancelled submit takes its future with it, and a second submit of an id in flight is refused."""
    played = Played(lambda msg, state: [])

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=None)
        try:
            for i in range(20):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(c.submit(IMAGE, "pick", request_id=f"g{i}"), 0.02)
            first = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="twice"))
            await asyncio.sleep(0.05)
            with pytest.raises(ValueError, match="in flight"):
                await c.submit(IMAGE, "pick", request_id="twice")
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            return dict(c._futures)
        finally:
            c.close()

    try:
        assert asyncio.run(scenario()) == {}
    finally:
        played.close()


@pytest.mark.parametrize("liveness_s", [None, 0.2])
def test_closing_an_async_client_fails_its_waiters(liveness_s):
    """close() with a submit in flight: it raises ClientClosed (it waited forever without liveness, and
    with it surfaced as a cancellation the caller never asked for); a submit after close raises it too."""
    played = Played(lambda msg, state: [])

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=liveness_s)
        waiter = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="x"))
        await asyncio.sleep(0.4)  # past the first PING, and (with liveness) into a probe of the silence
        c.close()
        done, _ = await asyncio.wait({waiter}, timeout=3)
        assert waiter in done, "still waiting after close()"
        with pytest.raises(ClientClosed):
            await c.submit(IMAGE, "pick", request_id="y")
        return waiter.exception()

    try:
        assert isinstance(asyncio.run(scenario()), ClientClosed)
    finally:
        played.close()


def test_an_async_error_without_a_group_blames_nobody_when_several_wait():
    """An ERROR that names no group, with two groups awaited: neither is failed for it (the oldest was);
    one that names a group fails that one."""

    def answer(msg, state):
        if msg.request_id == "named":
            return [(protocol.Kind.ERROR, protocol.ErrorReply("unreadable", "bad_type", request_id="named"))]
        if msg.request_id == "second":
            return [(protocol.Kind.ERROR, protocol.ErrorReply("unreadable", "bad_msgpack"))]
        return []

    played = Played(answer)

    async def scenario():
        c = AsyncClient(played.endpoint, liveness_s=None)
        try:
            first = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="first"))
            await asyncio.sleep(0.1)
            second = asyncio.ensure_future(c.submit(IMAGE, "pick", request_id="second"))
            with pytest.raises(ServiceError, match="bad_type"):
                await asyncio.wait_for(c.submit(IMAGE, "pick", request_id="named"), 3)
            await asyncio.sleep(0.2)
            return first.done(), second.done()
        finally:
            c.close()
            await asyncio.gather(first, second, return_exceptions=True)

    try:
        assert asyncio.run(scenario()) == (False, False)
    finally:
        played.close()


def test_an_async_submit_does_not_wait_forever_to_be_sent():
    """With nobody at the address ZMQ queues each SUBMIT, and past its queue's 1,000 messages a send
    waits until someone comes: it waited forever (a front's robots with it). Now SchedulerUnavailable
    within 2 x liveness_s, like a waiter's."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"

    async def scenario():
        c = AsyncClient(endpoint, liveness_s=0.2)
        try:
            calls = [c.submit(IMAGE, "pick", request_id=f"g{i}") for i in range(1005)]
            outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)
            return {type(o).__name__ for o in outcomes}
        finally:
            c.close()

    assert asyncio.run(scenario()) == {"SchedulerUnavailable"}
