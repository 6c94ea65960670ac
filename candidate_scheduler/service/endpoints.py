"""ZMQ endpoints: binding (port 0 picks a free port) and telling a loopback address from a network one."""

from __future__ import annotations

import ipaddress
import urllib.parse

import zmq


def bind_socket(sock: zmq.Socket, endpoint: str) -> str:
    """Bind; port 0 (tcp://host:0) picks a free port. Returns the endpoint actually bound."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        host = endpoint[len("tcp://"):-2]
        port = sock.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback address or ``localhost``. A wildcard
    (``*``, ``0.0.0.0``), an interface name or any other hostname counts as public."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    return is_loopback_host(urllib.parse.urlparse(endpoint).hostname or "")


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (IPv6 in brackets too); "", a wildcard or a name is public."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
