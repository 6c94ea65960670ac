"""A bearer token never reaches a log, even at DEBUG.

The websockets library logs every header of a handshake at DEBUG ("< Authorization: Bearer ..."), and so
do the openpi front (its `--log-level DEBUG`) and uvicorn's websocket protocol under sglang's HTTP server
(`--log-level debug`, logger "uvicorn.error"). Debug logs get pasted into tickets and shipped to log stores:
the token, the one credential a robot holds, must not be in them."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import pytest
import websockets
import websockets.asyncio.client

from candidate_scheduler.service import keys
from candidate_scheduler.service.openpi import msgpack_numpy
from candidate_scheduler.service.openpi.front import FrontConfig, OpenpiFront


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_side(caplog) -> str:
    """Every record but the test's own websocket client's (which logs the header it sends)."""
    return "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("websockets.client"))


def _token_dir(tmp_path):
    keys.init_dir(tmp_path)
    return keys.add_token(tmp_path, "robot"), keys.load_tokens(str(tmp_path))


def test_the_openpi_front_at_debug_logs_no_token(tmp_path, caplog):
    token, tokens = _token_dir(tmp_path)
    config = FrontConfig(f"tcp://127.0.0.1:{_free_port()}", None, port=0, tokens=tokens)

    async def run():
        front = OpenpiFront(config)
        url = await front.start()
        try:
            async with websockets.asyncio.client.connect(
                    url, additional_headers={"Authorization": f"Bearer {token}"}, compression=None,
                    open_timeout=5) as ws:
                assert "server" in msgpack_numpy.unpackb(await ws.recv())
            with pytest.raises(websockets.InvalidStatus):  # a wrong token: its handshake is logged too
                await websockets.asyncio.client.connect(
                    url, additional_headers={"Authorization": f"Bearer {token}x"}, open_timeout=5)
        finally:
            await front.close()

    caplog.set_level(logging.DEBUG)
    try:
        asyncio.run(run())
    finally:
        gc.collect()
    server_lines = [r.getMessage() for r in caplog.records if r.name.startswith("websockets.server")]
    assert any(line.lower().startswith("< authorization") for line in server_lines)  # the handshake was logged
    assert token not in _server_side(caplog)


def test_sglangs_http_server_at_debug_logs_no_token_of_a_websocket_handshake(tmp_path, caplog):
    uvicorn = pytest.importorskip("uvicorn")
    from candidate_scheduler.compat.http import TokenAuth, keep_tokens_out_of_logs

    token, tokens = _token_dir(tmp_path)

    async def app(scope, receive, send):  # what sglang's websocket routes do first: accept
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1000})

    keep_tokens_out_of_logs()  # what run_http_server does when it has tokens
    port = _free_port()
    # log_config None: uvicorn leaves the handlers alone (caplog's, on the root) and sets the level
    config = uvicorn.Config(TokenAuth(app, tokens), host="127.0.0.1", port=port, log_level="debug",
                            log_config=None, lifespan="off", ws="websockets-sansio")
    server = uvicorn.Server(config)

    async def run():
        serving = asyncio.ensure_future(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            async with websockets.asyncio.client.connect(
                    f"ws://127.0.0.1:{port}/v1/actions/realtime",
                    additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=5) as ws:
                with pytest.raises(websockets.ConnectionClosed):
                    await ws.recv()
        finally:
            server.should_exit = True
            await serving

    caplog.set_level(logging.DEBUG)
    asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.error"]
    assert any(line.lower().startswith("< authorization") for line in lines)  # the handshake was logged
    assert token not in _server_side(caplog)


def test_only_credential_headers_are_redacted():
    record = logging.LogRecord("websockets.server", logging.DEBUG, __file__, 1, "< %s: %s", ("Host", "example"),
                               None)
    assert keys.RedactCredentials().filter(record) and record.getMessage() == "< Host: example"
    for name in ("Authorization", "proxy-authorization", "Cookie"):
        record = logging.LogRecord("websockets.server", logging.DEBUG, __file__, 1, "< %s: %s",
                                   (name, "Bearer s3cret"), None)
        assert keys.RedactCredentials().filter(record)
        assert "s3cret" not in record.getMessage() and record.getMessage().startswith(f"< {name}: ")
