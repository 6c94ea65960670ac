"""`serve --insecure` lets the sglang compat socket off loopback (docs/deployment.md: "`--insecure` (or
`--compat-allow-nonlocal`) only"): the bridge it starts must be told so, or the bridge refuses its own bind
and `serve` exits with "the sglang compat bridge did not start"."""

from __future__ import annotations

import argparse

import pytest

from candidate_scheduler import commands
from candidate_scheduler.compat.bridge import build_parser
from candidate_scheduler.service import processes
from candidate_scheduler.service.endpoints import is_loopback_endpoint

BOUND = {"request": "tcp://0.0.0.0:5555", "control": "tcp://0.0.0.0:5556"}


def _bridge_argv(monkeypatch, **flags) -> argparse.Namespace:
    started = []

    def spawn_listening(cmd, pattern, name, timeout_s, env=None):
        started.append(cmd)
        return None, "tcp://0.0.0.0:5558"

    monkeypatch.setattr(processes, "spawn_listening", spawn_listening)
    args = argparse.Namespace(no_compat=False, compat_port=5558, **flags)
    commands._spawn_bridge(args, BOUND, None)
    (cmd,) = started
    return build_parser().parse_args(cmd[3:])  # python -m candidate_scheduler.compat.bridge ...


def _bridge_would_bind(parsed: argparse.Namespace) -> bool:
    # the bridge's own rule (compat/bridge.py Bridge.bind)
    return is_loopback_endpoint(parsed.bind) or parsed.allow_nonlocal


@pytest.mark.parametrize("insecure,allow", [(True, False), (False, True), (True, True)])
def test_a_public_compat_socket_serve_allows_is_one_the_bridge_binds(monkeypatch, insecure, allow):
    parsed = _bridge_argv(monkeypatch, compat_host="0.0.0.0", insecure=insecure, compat_allow_nonlocal=allow)
    assert parsed.bind == "tcp://0.0.0.0:5558"
    assert _bridge_would_bind(parsed)

