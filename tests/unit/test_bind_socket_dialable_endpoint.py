"""`bind_socket` returns the endpoint `serve` prints and hands its local workers (`up`) and launchers: one
they can dial. ZMQ's wildcard `*` binds but cannot be dialled, so the port-0 path must not echo it back
(a fixed port already came back as ZMQ's LAST_ENDPOINT, tcp://0.0.0.0:PORT)."""

from __future__ import annotations

import zmq

from candidate_scheduler.service.endpoints import bind_socket


def test_a_wildcard_on_a_picked_port_comes_back_dialable():
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        endpoint = bind_socket(router, "tcp://*:0")
        assert endpoint == router.getsockopt_string(zmq.LAST_ENDPOINT)  # as a fixed port's comes back
        dealer.connect(endpoint)  # ZMQError (EINVAL) for tcp://*:PORT
        dealer.send(b"hello")
        assert router.poll(5000)
        assert router.recv_multipart()[-1] == b"hello"
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_a_loopback_address_on_a_picked_port_keeps_its_address():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        endpoint = bind_socket(router, "tcp://127.0.0.1:0")
        host, port = endpoint.rsplit(":", 1)
        assert host == "tcp://127.0.0.1" and int(port) > 0
    finally:
        router.close(0)
        ctx.term()
