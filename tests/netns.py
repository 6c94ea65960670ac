"""Hosts for multi-host tests: network namespaces joined by veth pairs (tests run as root in CI).

`Hosts(tag)` makes a scheduler namespace and one namespace per other host, each joined to the
scheduler's by its own veth pair on its own /24: host i is 10.<net>.i.2, the scheduler 10.<net>.i.1 on
that link. Nothing else is routed: traffic stays between the namespaces the test made, and `close()`
deletes them (the veth pairs go with them). `python(host)` is a wrapper that runs this venv's Python
inside that namespace, for `Launcher(python=...)` or `subprocess`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


class NamespacesUnavailable(RuntimeError):
    pass


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise NamespacesUnavailable(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")


class Hosts:
    def __init__(self, tmp_path: Path, others: tuple[str, ...], net: int = 77):
        self.tag = f"cs{os.getpid() % 100000}"
        self.net = net
        self.tmp_path = tmp_path
        self.names = {"scheduler": f"{self.tag}-s", **{h: f"{self.tag}-{h[:3]}{i}" for i, h in enumerate(others)}}
        self.addresses: dict[str, str] = {}  # host -> its address; scheduler@host -> the scheduler's on that link
        made: list[str] = []
        try:
            for ns in self.names.values():
                _ip("netns", "add", ns)
                made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            for i, host in enumerate(others, start=1):
                a, b = f"{self.tag}a{i}", f"{self.tag}b{i}"
                _ip("link", "add", a, "type", "veth", "peer", "name", b)
                _ip("link", "set", a, "netns", self.names["scheduler"])
                _ip("link", "set", b, "netns", self.names[host])
                _ip("-n", self.names["scheduler"], "addr", "add", f"10.{net}.{i}.1/24", "dev", a)
                _ip("-n", self.names[host], "addr", "add", f"10.{net}.{i}.2/24", "dev", b)
                _ip("-n", self.names["scheduler"], "link", "set", a, "up")
                _ip("-n", self.names[host], "link", "set", b, "up")
                self.addresses[host] = f"10.{net}.{i}.2"
                self.addresses[f"scheduler@{host}"] = f"10.{net}.{i}.1"
        except NamespacesUnavailable:
            self._delete(made)
            raise

    def python(self, host: str, interpreter: str = sys.executable) -> str:
        """An executable that runs `interpreter` (default: this venv's Python) in `host`'s namespace."""
        path = self.tmp_path / f"python-in-{host}-{abs(hash(interpreter)) % 10**8}"
        path.write_text(f"#!/bin/sh\nexec ip netns exec {self.names[host]} {interpreter} \"$@\"\n")
        path.chmod(0o755)
        return str(path)

    def scheduler_seen_from(self, host: str, endpoint: str) -> str:
        """A `tcp://0.0.0.0:PORT` endpoint the scheduler printed, as `host` reaches it."""
        port = endpoint.rsplit(":", 1)[1]
        return f"tcp://{self.addresses['scheduler@' + host]}:{port}"

    def close(self) -> None:
        self._delete(list(self.names.values()))

    @staticmethod
    def _delete(names: list[str]) -> None:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
