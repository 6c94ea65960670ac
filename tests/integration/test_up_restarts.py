"""`up` starts a worker that died again (service/supervisor.py), under the same id, and serves on; a
worker that left on purpose stays gone."""

from __future__ import annotations

import os
import re
import signal
import sys

from candidate_scheduler.service.client import Client, synthetic_image
from candidate_scheduler.service.launcher import ENDPOINT_LINE
from candidate_scheduler.service.processes import ChildProcess
from tests.conftest import ENV, ROOT, wait_for


def _up(tmp_path, *extra: str) -> ChildProcess:
    return ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "up", "--workers", "1", "--adapter", "null",
                         "--device", "cpu", "--warmup-shapes", "", "--request-port", "0", "--control-port", "0",
                         "--worker-port", "0", "--metrics-port", "-1", "--no-compat", *extra],
                        tmp_path / "up.log", env=ENV, cwd=ROOT)


def _client(up: ChildProcess) -> Client:
    found = {m.group(1): m.group(2) for line in up.lines if (m := ENDPOINT_LINE.search(line))}
    return Client(found["request endpoint"], found["control endpoint"])


def _live(client: Client) -> list[str]:
    return sorted(client.stats()["workers"])


def test_a_worker_killed_outright_is_started_again_under_its_id_and_groups_are_served(tmp_path):
    up = _up(tmp_path)
    client = None
    try:
        first = int(up.wait_line(re.compile(r"worker 0 pid (\d+)"), 60).group(1))
        client = _client(up)
        ids = wait_for(lambda: _live(client), 30, "the worker to register")
        assert len(ids) == 1 and ids[0].endswith("-up0")
        os.kill(first, signal.SIGKILL)  # the OOM killer, a segfault in a CUDA library
        up.wait_line(re.compile(r"worker 0 \(pid \d+\) exited: killed by signal 9; starting it again"), 15)
        again = int(up.wait_line(re.compile(r"worker 0 started again, pid (\d+)"), 15).group(1))
        assert again != first
        # the new process registers under the dead one's id, in its place
        wait_for(lambda: client.stats()["workers"].get(ids[0], {}).get("capacity"), 30, "the restarted worker")
        assert _live(client) == ids
        result = client.submit(synthetic_image(), "pick", count=4, seed=1, timeout_s=30)
        assert result.ok, result
    finally:
        if client is not None:
            client.close()
        up.stop(timeout_s=15)


def test_a_worker_an_operator_took_away_is_not_started_again(tmp_path):
    up = _up(tmp_path)
    client = None
    try:
        up.wait_line(re.compile(r"worker 0 pid \d+"), 60)
        client = _client(up)
        (wid,) = wait_for(lambda: _live(client), 30, "the worker to register")
        client.worker_leave(wid)
        up.wait_line(re.compile(r"worker 0 \(pid \d+\) exited: it left \(exit 0\)"), 30)
        assert _live(client) == []
        assert not any("worker 0 started again" in line for line in up.lines)
    finally:
        if client is not None:
            client.close()
        up.stop(timeout_s=15)
