"""Endpoint addresses: whether a ZMQ endpoint is reachable only from this machine."""

from __future__ import annotations

import ipaddress
import urllib.parse


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback address or ``localhost``. A wildcard
    (``*``, ``0.0.0.0``), an interface name or any other hostname counts as public."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = urllib.parse.urlparse(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
