"""The HTTP server's header timeout (compat/header_timeout.py), on a real uvicorn server over loopback:
a connection that never finishes a request's head is closed, on its first request and on the next
one of a kept-alive connection; a request whose head arrived in time, a slow app and an open websocket
are not cut; installed, sglang's launcher starts uvicorn with it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
import websockets.sync.client

from candidate_scheduler.compat.header_timeout import protocol_class

TIMEOUT_S = 0.4


async def _app(scope, receive, send):
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message["text"]})
        return
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":  # an app that takes longer than the header timeout to answer
        await asyncio.sleep(3 * TIMEOUT_S)
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port():
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, http=protocol_class(TIMEOUT_S), ws="websockets",
                            log_level="warning", lifespan="off", timeout_keep_alive=60)
    server = uvicorn.Server(config)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield sock.getsockname()[1]
        server.should_exit = True
        thread.join(10)


def _closed_after(conn: socket.socket, limit_s: float = 5.0) -> float:
    """Seconds until the server closed `conn` (reads what it sends until EOF)."""
    t0 = time.monotonic()
    conn.settimeout(limit_s)
    while conn.recv(4096):
        pass
    return time.monotonic() - t0


def _response(conn: socket.socket) -> bytes:
    """One whole response (its head and Content-Length bytes of body)."""
    conn.settimeout(5)
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                          if line.lower().startswith(b"content-length:"))
            if len(body) >= length:
                return data
        chunk = conn.recv(4096)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk


def test_a_head_never_finished_is_closed_at_the_timeout(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        t0 = time.monotonic()
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
        for _ in range(2):  # dribbling bytes does not keep it open
            time.sleep(TIMEOUT_S / 4)
            conn.sendall(b"X-A: b\r\n")
        _closed_after(conn)
        assert TIMEOUT_S * 0.9 <= time.monotonic() - t0 < TIMEOUT_S + 2.0


def test_a_silent_connection_is_closed_too(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        assert _closed_after(conn) < TIMEOUT_S + 2.0


def test_the_next_head_on_a_kept_alive_connection_is_timed_from_the_last_response(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        time.sleep(TIMEOUT_S / 2)  # half the timeout before the first head: still in time
        conn.sendall(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(conn).endswith(b"/first")
        time.sleep(TIMEOUT_S * 0.75)  # past the first timer's end, not the second's
        conn.sendall(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(conn).endswith(b"/second")
        conn.sendall(b"GET /third HTTP/1.1\r\n")  # then a head that never ends
        assert _closed_after(conn) < TIMEOUT_S + 2.0


def test_a_request_whose_head_arrived_is_not_cut_by_a_slow_app(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(conn).endswith(b"/slow")


def test_an_open_websocket_outlives_the_timeout(port):
    with websockets.sync.client.connect(f"ws://127.0.0.1:{port}/ws", open_timeout=5) as ws:
        time.sleep(TIMEOUT_S * 3)
        ws.send("still here")
        assert ws.recv(timeout=5) == "still here"


def test_the_timeout_must_be_positive():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            protocol_class(bad)


@pytest.mark.sglang
def test_sglangs_launcher_runs_uvicorn_with_it_and_the_tls_files(monkeypatch):
    """run_http_server up to sglang's `uvicorn.run` call: the protocol with the timeout and, with `tls`,
    the files, on top of sglang's own options."""
    from sglang.multimodal_gen.runtime import launch_server

    from candidate_scheduler.compat import http
    from tests.tls_files import CERT, KEY

    calls = []
    monkeypatch.setattr(launch_server.uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.setattr(launch_server, "launch_http_server_only",
                        lambda sa: launch_server.uvicorn.run("app", host=sa, port=1))
    monkeypatch.setattr(http, "make_http_server_args", lambda *a, **k: "127.0.0.1")
    for hook in ("install_http_shims", "install_no_offline_broker", "install_app_guards"):
        monkeypatch.setattr(http, hook, lambda *a, **k: None)
    http.run_http_server(1, "/nonexistent", header_timeout_s=2.5)
    http.run_http_server(1, "/nonexistent", header_timeout_s=1.5, tls=(CERT, KEY))  # again: replaced, not wrapped
    first, second = calls
    assert first["http"].header_timeout_s == 2.5 and "ssl_certfile" not in first and first["port"] == 1
    assert second["http"].header_timeout_s == 1.5 and (second["ssl_certfile"], second["ssl_keyfile"]) == (CERT, KEY)
