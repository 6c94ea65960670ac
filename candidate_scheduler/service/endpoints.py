"""ZMQ endpoints: writing one from a host and port, binding (port 0 picks a free port), IPv6 addresses,
and telling a loopback address from a network one."""

from __future__ import annotations

import ipaddress
import re
import socket

import zmq

# host:port and nothing else. ZMQ also reads `tcp://SOURCE;ADDRESS` (bind: the part after ";"), so
# urlparse's hostname of "tcp://127.0.0.1:1;0.0.0.0:5555" is loopback while ZMQ listens on 0.0.0.0:
# anything that is not plainly one host and one port counts as public.
_TCP = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d+|\*)")


def tcp_endpoint(host: str, port: int | str) -> str:
    """tcp://HOST:PORT; an IPv6 address goes in brackets (``tcp://::1:5555`` is no endpoint ZMQ reads)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def ipv6_for(sock: zmq.Socket, endpoint: str | None) -> zmq.Socket:
    """Turn on ZMQ's IPV6 option when `endpoint` names an IPv6 address (``tcp://[::1]:5555``): without it
    ZMQ refuses one. Only then: with it a host name may resolve to its IPv6 address first, and
    ``tcp://localhost:5555`` would dial ::1 where the scheduler listens on 127.0.0.1."""
    if endpoint is not None and endpoint.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    return sock


def bind_socket(sock: zmq.Socket, endpoint: str) -> str:
    """Bind; port 0 (tcp://host:0) picks a free port. Returns the endpoint actually bound, as ZMQ says it:
    one that can be dialled (a wildcard ``*`` comes back as 0.0.0.0, as it does for a fixed port)."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        sock.bind_to_random_port(endpoint[:-2])
    else:
        sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback host (`is_loopback_host`). A wildcard
    (``*``, ``0.0.0.0``), an interface name, any other hostname, or an endpoint that is not plainly
    ``tcp://HOST:PORT`` (ZMQ's ``SOURCE;ADDRESS`` form included) counts as public."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    parts = tcp_host_port(endpoint)
    return parts is not None and is_loopback_host(parts[0].lower())


def tcp_host_port(endpoint: str) -> tuple[str, str] | None:
    """(HOST, PORT) of a plain ``tcp://HOST:PORT`` endpoint (PORT may be ``*``), or None for any other form."""
    m = _TCP.fullmatch(endpoint)
    return None if m is None else (m.group(1), m.group(2))


def is_loopback_host(host: str | None) -> bool:
    """A loopback address (IPv6 in brackets too), or ``localhost`` when every address the resolver
    gives for it is one; "", a wildcard, any other name or no string at all (None: asyncio's "every
    interface") is public."""
    if not isinstance(host, str):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host.lower() != "localhost":
        return False
    # The bind resolves the name: a hosts file that maps localhost to a network address would open
    # there, without keys or tokens, what a number would have been refused for.
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    try:
        return bool(found) and all(ipaddress.ip_address(a).is_loopback for a in found)
    except ValueError:
        return False
