"""The sglang_sequential arm (bench/sglang_fcfs.py) takes CANCEL: a queued group is answered `cancelled`,
a running one before its next candidate; and it listens off loopback only when told (--insecure). Its
pipeline is stood in for; the sockets are real."""

from __future__ import annotations

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.bench.sglang_fcfs import FcfsServer
from candidate_scheduler.service.client import make_request

IMAGE = np.full((16, 16, 3), 9, dtype=np.uint8)


class _Clock:
    entered_at = None


def _server() -> FcfsServer:
    server = FcfsServer.__new__(FcfsServer)  # no sglang: the pipeline is the `reference` passed in
    server.live, server.cancelled, server.clock = set(), set(), _Clock()
    server.pipeline = server.server_args = None
    return server


def test_a_running_group_stops_before_its_next_candidate():
    server = _server()
    msg = make_request(IMAGE, "pick", count=4, seed=1, steps=2, request_id="g")
    server.live.add("g")
    calls = []

    def reference(*_args):
        calls.append(1)
        server.cancelled.add("g")  # CANCEL arrives while the first candidate runs
        return np.zeros((16, 7), np.float32)

    result = server._run_group(msg, 0.0, reference)
    assert result.status == "cancelled" and len(calls) == 1
    server.cancelled.clear()
    done = server._run_group(make_request(IMAGE, "pick", count=2, seed=1, steps=2, request_id="h"), 0.0,
                             lambda *_a: np.zeros((16, 7), np.float32))
    assert done.status == "done"


def test_cancel_on_the_control_socket_marks_only_live_groups():
    server = _server()
    server.live.add("live")
    ctx = zmq.Context()
    try:
        server.control = ctx.socket(zmq.ROUTER)
        port = server.control.bind_to_random_port("tcp://127.0.0.1")
        client = ctx.socket(zmq.DEALER)
        client.connect(f"tcp://127.0.0.1:{port}")
        answers = {}
        for rid in ("live", "never-sent"):
            client.send_multipart(protocol.encode(protocol.Kind.CANCEL, protocol.CancelRequest(rid)))
            server._on_control(server.control.recv_multipart())
            _kind, answers[rid] = protocol.decode_frames(client.recv_multipart(), {protocol.Kind.CONTROL_REPLY})
        assert answers["live"].ok and answers["live"].changed
        assert answers["never-sent"].ok and not answers["never-sent"].changed and answers["never-sent"].state == "unknown"
        assert server.cancelled == {"live"}
        client.send_multipart(protocol.encode(protocol.Kind.STATS, protocol.Empty()))
        server._on_control(server.control.recv_multipart())
        _kind, refused = protocol.decode_frames(client.recv_multipart(), {protocol.Kind.CONTROL_REPLY})
        assert not refused.ok
    finally:
        ctx.destroy(0)


def test_it_refuses_to_listen_off_loopback_unless_told(capsys):
    import pytest

    from candidate_scheduler.bench.sglang_fcfs import main

    with pytest.raises(SystemExit) as exc:  # refused before the model is loaded (there is none here)
        main(["--model", "/nonexistent", "--bind", "tcp://0.0.0.0:0"])
    assert exc.value.code == 2 and "--insecure" in capsys.readouterr().err
