"""What counts as loopback decides what may listen without keys or tokens (service/endpoints.py).
`localhost` is a name: it is loopback only when every address it resolves to is, as the bind will use
the resolver's answer, not the name."""

from __future__ import annotations

import socket

import pytest

from candidate_scheduler.compat import http
from candidate_scheduler.service.endpoints import is_loopback_endpoint, is_loopback_host
from candidate_scheduler.service.openpi.launch import bind_refusal


def _resolving(monkeypatch, *addresses: str, fail: bool = False) -> list[str]:
    asked = []

    def getaddrinfo(host, *args, **kwargs):
        asked.append(host)
        if fail:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, 0, 0, 0) if ":" in a else (a, 0)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_localhost_mapped_to_a_network_address_is_public(monkeypatch):
    asked = _resolving(monkeypatch, "127.0.0.1", "10.1.2.3")  # an /etc/hosts entry "10.1.2.3 localhost"
    assert not is_loopback_host("localhost")
    assert not is_loopback_endpoint("tcp://localhost:5555")
    assert bind_refusal("localhost", None, False) is not None  # the openpi websocket: tokens needed
    with pytest.raises(ValueError, match="without tokens"):  # sglang's HTTP server too
        http.run_http_server(30001, "/nonexistent", "localhost", 30000)
    assert asked


def test_localhost_that_does_not_resolve_is_not_taken_for_loopback(monkeypatch):
    _resolving(monkeypatch, fail=True)
    assert not is_loopback_host("localhost")


@pytest.mark.parametrize("name", ["localhost", "LocalHost"])
def test_localhost_resolving_to_loopback_stays_loopback(monkeypatch, name):
    _resolving(monkeypatch, "127.0.0.1", "::1")
    assert is_loopback_host(name)
    assert is_loopback_endpoint(f"tcp://{name}:5555")


def test_addresses_are_not_looked_up(monkeypatch):
    asked = _resolving(monkeypatch, "10.1.2.3")
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("[::1]")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("::") and not is_loopback_host("")
    assert not is_loopback_host("robot-gateway")  # any other name is public, without asking
    assert asked == []


def test_an_ipv6_host_makes_an_endpoint_in_brackets_that_reads_as_loopback():
    from candidate_scheduler.service.endpoints import is_loopback_endpoint, tcp_endpoint

    assert tcp_endpoint("::1", 5555) == "tcp://[::1]:5555" and is_loopback_endpoint(tcp_endpoint("::1", 0))
    assert tcp_endpoint("[::1]", 5555) == "tcp://[::1]:5555" and tcp_endpoint("10.0.0.1", 1) == "tcp://10.0.0.1:1"
    assert not is_loopback_endpoint(tcp_endpoint("::", 5555))  # every IPv6 interface


def test_only_an_ipv6_address_turns_on_zmqs_ipv6_option():
    """With it a name may resolve to its IPv6 address first: `tcp://localhost:5555` would dial ::1 where the
    scheduler listens on 127.0.0.1. So names and IPv4 addresses keep the option off."""
    import zmq

    from candidate_scheduler.service.endpoints import ipv6_for

    ctx = zmq.Context()
    try:
        for endpoint, on in (("tcp://[::1]:5555", 1), ("tcp://[::]:0", 1), ("tcp://localhost:5555", 0),
                             ("tcp://127.0.0.1:5555", 0), (None, 0)):
            sock = ipv6_for(ctx.socket(zmq.DEALER), endpoint)
            assert sock.getsockopt(zmq.IPV6) == on, endpoint
            sock.close(0)
    finally:
        ctx.term()
