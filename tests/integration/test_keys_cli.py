"""The CLI at the edges of the access rules: a --host in ZMQ's `SOURCE;ADDRESS` form (which binds the
address after the ";") is refused like any other off-loopback bind without keys, and `keys` refuses,
in one line, a name that would leave a directory `serve --curve-dir` cannot load."""

from __future__ import annotations

import subprocess
import sys

from candidate_scheduler.service.keys import Directory
from tests.conftest import ENV, ROOT

CLI = [sys.executable, "-m", "candidate_scheduler.cli"]
PORTS = ["--request-port", "0", "--control-port", "0", "--worker-port", "0", "--metrics-port", "-1"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)


def _refused(*args: str) -> str:
    out = _run(*args)
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_a_source_semicolon_address_host_is_off_loopback():
    line = _refused("serve", "--host", "127.0.0.1:1;0.0.0.0", *PORTS, "--no-compat")
    assert "off loopback" in line and "--curve-dir" in line and "0.0.0.0" in line
    line = _refused("serve", "--worker-host", "127.0.0.1:1;0.0.0.0", *PORTS, "--no-compat")
    assert "worker socket off loopback" in line


def test_keys_refuses_a_name_the_scheduler_could_not_load(tmp_path):
    d = tmp_path / "keys"
    assert _run("keys", str(d), "--token", "robot1", "--tenant", "robots").returncode == 0
    line = _refused("keys", str(d), "--client", "robot1")  # tenant default: another principal
    assert "robot1" in line and "robots" in line
    line = _refused("keys", str(d), "--token", "sglang-bridge")
    assert "sglang-bridge" in line
    assert Directory.load(d).get("robot1").tenant == "robots"  # serve --curve-dir still starts
    (tmp_path / "file").write_text("")
    line = _refused("keys", str(tmp_path / "file"))
    assert "key directory" in line


def test_a_port_in_use_is_one_line_not_a_traceback():
    import socket
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        port = str(held.getsockname()[1])
        line = _refused("serve", "--request-port", port, "--control-port", "0", "--worker-port", "0",
                        "--metrics-port", "-1", "--no-compat")
        assert f"tcp://127.0.0.1:{port}" in line and "request socket" in line and "in use" in line
    finally:
        held.close()
