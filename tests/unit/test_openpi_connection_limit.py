"""The openpi front's connection limit: each open websocket can hold a few frames of up to twice the
frame limit, so the number of robots connected decides the front's memory. Past `max_connections` a
handshake is an HTTP 503 with Retry-After; a robot that leaves frees its place; the limit holds when
handshakes race; and `serve` / `up` hand the limit to the front they start."""

from __future__ import annotations

import argparse
import asyncio
import gc
import socket

import pytest
import websockets
import websockets.asyncio.client

from candidate_scheduler.service.openpi import launch, msgpack_numpy
from candidate_scheduler.service.openpi.front import DEFAULT_MAX_CONNECTIONS, FrontConfig, OpenpiFront


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _front(limit: int) -> OpenpiFront:
    # no scheduler behind it: the metadata says it is unreachable, which is all a connection needs here
    return OpenpiFront(FrontConfig(_unused_endpoint(), None, port=0, max_connections=limit))


async def _connect(url: str):
    ws = await websockets.asyncio.client.connect(url, compression=None, max_size=None, open_timeout=5)
    msgpack_numpy.unpackb(await ws.recv())  # the metadata frame: the connection is being served
    return ws


def _run(coro) -> None:
    asyncio.run(coro)
    gc.collect()  # AsyncClient's PING tasks' "never retrieved" finalizers run here, not in a later test


def test_a_robot_past_the_limit_is_refused_with_503_and_the_others_keep_their_connections():
    async def run():
        front = _front(2)
        url = await front.start()
        try:
            first, second = await _connect(url), await _connect(url)
            with pytest.raises(websockets.InvalidStatus) as refused:
                await _connect(url)
            response = refused.value.response
            assert response.status_code == 503
            assert response.headers["Retry-After"] == "1"
            assert b"too many connections" in response.body
            assert front.stats["refused:full"] == 1
            # the two robots inside are still served: a frame that is not an observation is answered, not dropped
            await first.send("not an observation")
            assert "binary msgpack-numpy frame" in await first.recv()
            assert second.state is websockets.protocol.State.OPEN
            await first.close()
            for _ in range(100):  # the front sees the close after its handler ends
                if front.live < 2:
                    break
                await asyncio.sleep(0.01)
            third = await _connect(url)  # the place the first robot left is free again
            assert front.live == 2
            await asyncio.gather(second.close(), third.close())
        finally:
            await front.close()

    _run(run())


def test_handshakes_that_race_past_the_check_are_closed_with_1013_and_the_limit_holds():
    """Handshakes are checked before the upgrade, against the connections whose handlers run; several that
    pass the check together end past the limit, and the handler closes the extra ones at once. The race
    is made certain here by skipping the handshake check."""

    async def run():
        front = _front(2)
        front._process_request = lambda connection, request: None  # every handshake passes, as in a race
        url = await front.start()
        try:
            results = await asyncio.gather(*[_connect(url) for _ in range(5)], return_exceptions=True)
            served = [r for r in results if not isinstance(r, BaseException)]
            closed = [r for r in results if isinstance(r, websockets.ConnectionClosed)]
            assert len(served) == 2, results
            assert len(closed) == 3, results
            assert {c.rcvd.code for c in closed} == {1013}
            assert "too many connections" in closed[0].rcvd.reason
            for _ in range(100):  # the closing handlers end once their close handshakes do
                if front.live == 2:
                    break
                await asyncio.sleep(0.01)
            assert front.live == 2 and front.stats["refused:full"] == 3
            await asyncio.gather(*[ws.close() for ws in served])
        finally:
            await front.close()

    _run(run())


def test_healthz_answers_even_when_the_front_is_full():
    async def run():
        front = _front(1)
        url = await front.start()
        try:
            ws = await _connect(url)
            host, port = url.removeprefix("ws://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 5)
            writer.close()
            assert b" 200 " in status
            await ws.close()
        finally:
            await front.close()

    _run(run())


def test_the_limit_is_a_flag_of_the_front_and_of_serve_and_up(capsys):
    args = launch.build_parser().parse_args(["--scheduler-request", "tcp://x:1", "--max-connections", "5"])
    assert args.max_connections == 5
    assert launch.build_parser().parse_args(["--scheduler-request", "tcp://x:1"]).max_connections is None
    serve = argparse.ArgumentParser()
    launch.add_openpi_arguments(serve)
    # what `serve --openpi-max-connections 7` gives the front it starts
    assert "--max-connections=7" in launch.defaults_argv(serve.parse_args(["--openpi-max-connections", "7"]))
    with pytest.raises(SystemExit):
        serve.parse_args(["--openpi-max-connections", "0"])
    assert "--openpi-max-connections" in capsys.readouterr().err
    assert FrontConfig("tcp://x:1").max_connections == DEFAULT_MAX_CONNECTIONS
