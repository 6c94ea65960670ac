"""`serve` notices a front that died (service/front_watch.py): the sglang compat bridge killed with
SIGKILL (the OOM killer, an operator's `kill -9`) is said on stderr, started again on the same port,
and counted; sglang clients that were refused at connect are served again. After `serve` stops,
nothing is started again and the restarted bridge stops with it."""

from __future__ import annotations

import os
import pickle
import re
import signal
import urllib.request

import zmq

from tests.conftest import wait_for
from tests.integration.test_child_processes import _alive, _children

RESTARTED = re.compile(r"the sglang compat bridge started again, pid (\d+), on (\S+)")


def _pings(endpoint: str) -> bool:
    """Whether the bridge on `endpoint` answers an sglang ping within a second (a fresh connection)."""
    s = zmq.Context.instance().socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(endpoint)
        s.send(pickle.dumps({"method": "ping"}))
        if not s.poll(1000):
            return False
        s.recv()
        return True
    finally:
        s.close(0)


def _restarts(metrics_url: str, api: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'candidate_scheduler_front_restarts_total{{api="{api}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no front_restarts_total{{api={api!r}}} in /metrics")


def test_a_killed_compat_bridge_is_started_again_on_its_port_and_counted(services):
    sched = services.scheduler(compat=True, metrics=True)
    assert _pings(sched.compat)
    (first,) = _children(sched.proc.pid)
    assert _restarts(sched.metrics, "compat") == 0
    os.kill(first, signal.SIGKILL)

    m = sched.proc.wait_line(RESTARTED, 20)
    second = int(m.group(1))
    assert second != first and m.group(2) == sched.compat  # the port the clients know, though it was asked as 0
    assert any("the sglang compat bridge" in line and "killed by signal 9" in line for line in sched.proc.lines)
    assert wait_for(lambda: _pings(sched.compat), 20, "the restarted bridge to answer a fresh sglang connection")
    assert _children(sched.proc.pid) == [second]
    assert _restarts(sched.metrics, "compat") == 1
    assert _restarts(sched.metrics, "openpi") == 0

    # serve's stop: the restarted bridge stops with it, and nothing is started again
    sched.proc.proc.send_signal(signal.SIGTERM)
    sched.proc.proc.wait(timeout=20)
    wait_for(lambda: not _alive(second), 10, "the restarted bridge to stop with serve")
    assert len([line for line in sched.proc.lines if RESTARTED.search(line)]) == 1


def test_a_killed_openpi_front_is_started_again_on_its_port_and_counted(services):
    import websockets.sync.client

    sched = services.scheduler("--openpi-port", "0", metrics=True)
    url = next(m.group(1) for line in sched.proc.lines if (m := re.search(r"openpi policy\s+(ws://\S+)", line)))
    (first,) = _children(sched.proc.pid)
    os.kill(first, signal.SIGKILL)

    m = sched.proc.wait_line(re.compile(r"the openpi front started again, pid (\d+), on (\S+)"), 30)
    assert int(m.group(1)) != first and m.group(2) == url  # asked as port 0: started again on the one it bound
    ws = websockets.sync.client.connect(url, compression=None, open_timeout=10)
    try:
        assert ws.recv(timeout=10)  # the openpi metadata frame: the robot is served again
    finally:
        ws.close()
    assert _restarts(sched.metrics, "openpi") == 1
    assert _restarts(sched.metrics, "compat") == 0
