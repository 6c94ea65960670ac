"""The openpi front in process, in front of the fake native scheduler (tests/compat/conftest.py) or of
no scheduler at all: robots connecting while the scheduler is away, robots that leave mid-call, and
the front closing with calls in flight. openpi's own client is exercised in tests/compat/test_openpi.py."""

from __future__ import annotations

import asyncio
import gc
import socket
import time

import numpy as np
import pytest
import websockets
import websockets.asyncio.client

from candidate_scheduler import protocol
from candidate_scheduler.service.openpi import msgpack_numpy
from candidate_scheduler.service.openpi.front import FrontConfig, OpenpiFront
from tests.compat.conftest import HOLD_PROMPT, FakeScheduler

IMAGE = np.zeros((16, 16, 3), np.uint8)


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


async def _connect(url: str):
    ws = await websockets.asyncio.client.connect(url, compression=None, max_size=None)
    meta = msgpack_numpy.unpackb(await ws.recv())
    return ws, meta


def _run(coro) -> None:
    asyncio.run(coro)
    # AsyncClient's shared PING tasks can end with ClientClosed that nobody retrieves; their "never retrieved"
    # finalizers run here, not inside a later compile() (CPython 3.11 raises SystemError there)
    gc.collect()


@pytest.fixture
def fake():
    f = FakeScheduler()
    yield f
    f.close()


def test_robots_connecting_while_the_scheduler_is_away_get_metadata_at_once_not_in_turn():
    """Each connection asked STATS on the one control link, one at a time: with the scheduler away each
    ask waited its 1 s timeout, so the sixth robot got its metadata after 6 s."""

    async def run():
        front = OpenpiFront(FrontConfig(_unused_endpoint(), _unused_endpoint(), port=0))
        url = await front.start()
        try:
            started = time.monotonic()

            async def one():
                ws, meta = await _connect(url)
                await ws.close()
                return time.monotonic() - started, meta

            got = await asyncio.gather(*[one() for _ in range(6)])
        finally:
            await front.close()
        assert all(meta["scheduler"] == {"reachable": False} for _, meta in got)
        assert max(t for t, _ in got) < 2.5, [round(t, 2) for t, _ in got]

    _run(run())


def test_a_robot_that_leaves_mid_call_has_its_group_cancelled_and_leaves_nothing_behind(fake):
    async def run():
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0))
        url = await front.start()
        try:
            mark = fake.mark()
            ws, _ = await _connect(url)
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": HOLD_PROMPT}))
            await asyncio.to_thread(fake.wait, lambda: len(fake.received) > mark, 10.0, "the held group")
            rid = fake.since(mark)[0].request_id
            await ws.close()
            await asyncio.to_thread(fake.wait, lambda: rid in fake.cancels, 10.0, "the cancel")
            for _ in range(100):
                if not front._server.handler_tasks and not front.client._futures:
                    break
                await asyncio.sleep(0.05)
            assert not front._server.handler_tasks and not front.client._futures
            assert front.stats["cancelled_on_disconnect"] == 1 and front.stats["error:internal"] == 0
            # the front keeps serving
            ws, _ = await _connect(url)
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": "fine", "seed": 3}))
            reply = msgpack_numpy.unpackb(await asyncio.wait_for(ws.recv(), 10))
            assert reply["candidate_seeds"] == [3]
            await ws.close()
        finally:
            await front.close()

    _run(run())


def test_closing_the_front_with_calls_in_flight_cancels_their_groups_and_returns(fake):
    """SIGTERM's path (launch.main cancels serve_forever, then close): every robot is closed with 1001
    (going away), every held group is cancelled, and close does not wait on the scheduler."""

    async def run():
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0))
        url = await front.start()
        serving = asyncio.ensure_future(front.serve_forever())
        mark = fake.mark()
        robots = [(await _connect(url))[0] for _ in range(3)]
        for ws in robots:
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": HOLD_PROMPT}))
        await asyncio.to_thread(fake.wait, lambda: len(fake.received) >= mark + 3, 10.0, "the held groups")
        rids = {r.request_id for r in fake.since(mark)}
        started = time.monotonic()
        serving.cancel()
        await serving
        await front.close()
        assert time.monotonic() - started < 5.0
        for ws in robots:
            with pytest.raises(websockets.ConnectionClosed) as exc:
                await asyncio.wait_for(ws.recv(), 5)
            assert exc.value.rcvd is not None and exc.value.rcvd.code == 1001
        await asyncio.to_thread(fake.wait, lambda: rids <= set(fake.cancels), 10.0, "the cancels")
        assert front.stats["error:internal"] == 0

    _run(run())


def test_closing_the_front_while_the_scheduler_is_away_does_not_wait_a_cancel_timeout_per_robot():
    """Each robot's handler awaited its group's CANCEL, one at a time on the control link: with the
    scheduler gone each waited the 1 s timeout, so closing with six robots in flight took 6 s (sixty: a
    minute, past a SIGTERM grace period)."""

    async def run():
        fake = FakeScheduler()
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0))
        url = await front.start()
        serving = asyncio.ensure_future(front.serve_forever())
        mark = fake.mark()
        robots = [(await _connect(url))[0] for _ in range(6)]
        for ws in robots:
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": HOLD_PROMPT}))
        await asyncio.to_thread(fake.wait, lambda: len(fake.received) >= mark + 6, 10.0, "the held groups")
        fake.close()  # the scheduler goes away with the groups in flight
        started = time.monotonic()
        serving.cancel()
        await serving
        await front.close()
        took = time.monotonic() - started
        assert took < 4.0, took  # one CANCEL timeout per robot was 6 s
        assert front.stats["cancelled_on_disconnect"] == 6 and not front._cancels
        for ws in robots:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)

    _run(run())


def test_an_error_that_quotes_a_huge_field_is_a_short_text_frame(fake):
    """Errors quote the value sent (deadline_s must be a number ..., got '<it>'): a 4 MB string came back
    as a 4 MB text frame. The quote is cut, and the connection keeps serving."""

    async def run():
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0))
        url = await front.start()
        try:
            ws, _ = await _connect(url)
            for bad in ({"deadline_s": "x" * 4_000_000}, {"candidates": {"y" * 4_000_000: 1}}):
                await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": "go", **bad}))
                text = await asyncio.wait_for(ws.recv(), 10)
                assert isinstance(text, str) and text.startswith("candidate_scheduler openpi: "), text[:200]
                assert len(text) < 4000 and "more characters" in text, len(text)
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": "fine", "seed": 4}))
            assert msgpack_numpy.unpackb(await asyncio.wait_for(ws.recv(), 10))["candidate_seeds"] == [4]
            await ws.close()
        finally:
            await front.close()

    _run(run())


class _Scheduler(FakeScheduler):
    """Answers the CANCEL of a group it has not received as the real scheduler does (core/control.py):
    ok, nothing changed, state "unknown"."""

    def _on_control(self, frames: list[bytes]) -> None:
        identity, delimited, kind, payload = protocol.split_envelope(frames, protocol.CONTROL_KINDS)
        msg = protocol.decode(kind, payload)
        if kind is protocol.Kind.CANCEL and msg.request_id not in self._held and \
                msg.request_id not in {r.request.request_id for r in self.received}:
            with self.event:
                self.cancels.append(msg.request_id)
                self.event.notify_all()
            reply = protocol.ControlReply(ok=True, changed=False, state="unknown")
            self.ctl.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY, reply))
            return
        super()._on_control(frames)


def test_robots_that_send_a_big_observation_and_leave_at_once_leave_no_group_running():
    """The group's SUBMIT (megabytes, on the request socket) and its CANCEL (bytes, on the control socket)
    race to the scheduler; the CANCEL often came first, found nothing ("unknown"), and the group then ran
    for nobody: 1 or 2 of 8 such robots left a group held on the fake scheduler."""

    async def run():
        fake = _Scheduler()
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0))
        url = await front.start()
        try:
            ws, _ = await _connect(url)  # a first call: the front's client knows the scheduler from here on
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": "x", "seed": 1}))
            await ws.recv()
            await ws.close()
            big = np.random.default_rng(0).integers(0, 255, (2000, 2000, 3), dtype=np.uint8)
            frame = msgpack_numpy.packb({"observation/image": big, "prompt": HOLD_PROMPT})
            for _ in range(8):
                ws, _ = await _connect(url)
                await ws.send(frame)
                await ws.close()
            for _ in range(100):
                await asyncio.sleep(0.05)
                if not front._cancels and not front._server.handler_tasks:
                    break
            await asyncio.sleep(0.2)  # a SUBMIT still on its way would be held by now
            with fake.event:
                held = list(fake._held)
            assert held == [], f"{len(held)} groups run for robots that left: {front.stats}"
            assert front.stats["cancelled_on_disconnect"] + front.stats["left_before_submit"] == 8
        finally:
            await front.close()
            fake.close()

    _run(run())


class _SlowSubmits(_Scheduler):
    """Reads a held group's SUBMIT only after a CANCEL for it came: a SUBMIT still on its way."""

    def __init__(self):
        self.in_transit: dict[str, list[bytes]] = {}
        super().__init__()

    def _on_request(self, frames: list[bytes]) -> None:
        _, _, kind, payload = protocol.split_envelope(frames, protocol.REQUEST_KINDS)
        msg = protocol.decode(kind, payload)
        if kind is protocol.Kind.SUBMIT and msg.prompt == HOLD_PROMPT:
            with self.event:
                self.in_transit[msg.request_id] = frames
                self.event.notify_all()
            return
        super()._on_request(frames)

    def _on_control(self, frames: list[bytes]) -> None:
        super()._on_control(frames)
        _, _, kind, payload = protocol.split_envelope(frames, protocol.CONTROL_KINDS)
        msg = protocol.decode(kind, payload)
        late = self.in_transit.pop(msg.request_id, None) if kind is protocol.Kind.CANCEL else None
        if late is not None:
            super()._on_request(late)  # arrives now, after its cancel was answered "unknown"


def test_a_cancel_that_overtakes_its_submit_is_sent_again_until_the_group_is_there():
    async def run():
        fake = _SlowSubmits()
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0))
        url = await front.start()
        try:
            ws, _ = await _connect(url)
            await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": HOLD_PROMPT}))
            await asyncio.to_thread(fake.wait, lambda: fake.in_transit, 10.0, "the SUBMIT on its way")
            await ws.close()
            await asyncio.to_thread(fake.wait, lambda: len(fake.cancels) >= 2 and not fake._held, 10.0,
                                    "a second CANCEL that finds the group")
            assert not fake.in_transit and fake.received
        finally:
            await front.close()
            fake.close()

    _run(run())


def test_an_observation_over_the_schedulers_message_limit_is_refused_not_an_internal_error(fake):
    """With --max-frame-bytes raised past the native message limit (64 MiB), a big uint8 image failed
    in AsyncClient's submit_frames (ValueError): answered "internal error", logged with a traceback."""

    async def run():
        config = FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0, max_frame_bytes=80 << 20)
        front = OpenpiFront(config)
        url = await front.start()
        try:
            ws, _ = await _connect(url)
            big = np.zeros((4800, 4800, 3), np.uint8)  # 69 MB
            await ws.send(msgpack_numpy.packb({"observation/image": big, "prompt": "go"}))
            del big
            text = await asyncio.wait_for(ws.recv(), 60)
            assert isinstance(text, str) and "internal error" not in text and "over the scheduler's limit" in text, text
            assert front.stats["error:internal"] == 0 and front.stats["error:too_large"] == 1
            await ws.close()
        finally:
            await front.close()

    _run(run())


def test_robots_timing_out_together_while_the_scheduler_is_away_are_answered_at_their_timeout():
    """Each timed-out call awaited its CANCEL before answering, one at a time on the control link: with
    the scheduler gone and --request-timeout 1, six robots were answered at 2, 3, ... 7 s."""

    async def run():
        fake = FakeScheduler()
        front = OpenpiFront(FrontConfig(fake.request_endpoint, fake.control_endpoint, port=0, request_timeout_s=1.0))
        url = await front.start()
        try:
            robots = [(await _connect(url))[0] for _ in range(6)]
            fake.close()
            started = time.monotonic()

            async def one(ws):
                await ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "prompt": HOLD_PROMPT}))
                text = await asyncio.wait_for(ws.recv(), 15)
                return time.monotonic() - started, text

            got = await asyncio.gather(*[one(ws) for ws in robots])
            assert all(isinstance(text, str) and "no result within 1.0 s" in text for _, text in got), got
            assert max(t for t, _ in got) < 2.5, [round(t, 2) for t, _ in got]
        finally:
            await front.close()

    _run(run())
