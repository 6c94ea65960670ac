"""What a scheduler killed outright (SIGKILL: the OOM killer, Ray killing its actor, a supervisor's kill
timeout) leaves behind: nothing. The sglang compat bridge that `serve` starts, and the workers `up` starts,
die with it; else the bridge kept the compat port, and the next run on the same ports (what a supervisor
or Ray restarts) could not start at all, and `up`'s workers kept dialling a scheduler that was gone."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from candidate_scheduler.service.processes import ChildProcess
from tests.conftest import ENV, ROOT, wait_for


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (read from /proc: no psutil, no pgrep)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its parent (init, here) has not reaped it yet


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_compat_bridge_dies_with_a_killed_scheduler_and_the_next_run_starts_on_its_ports(services):
    first = services.scheduler(compat=True)
    bridges = _children(first.proc.pid)
    assert len(bridges) == 1, bridges
    try:
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.proc.wait(timeout=10)
        wait_for(lambda: not _alive(bridges[0]), 10, "the bridge to die with its scheduler")
        # the next run, on every port of the first one, the compat port included
        again = services.scheduler(*first.same_ports(), "--compat-port", first.compat.rsplit(":", 1)[1],
                                   compat=True, name="next-run")
        assert again.compat == first.compat and again.request == first.request
    finally:
        _kill_all([pid for pid in bridges if _alive(pid)])


def test_the_workers_up_started_die_with_it(tmp_path):
    up = ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "up", "--workers", "2", "--adapter", "null",
                       "--device", "cpu", "--warmup-shapes", "", "--request-port", "0", "--control-port", "0",
                       "--worker-port", "0", "--metrics-port", "-1", "--no-compat"],
                      tmp_path / "up.log", env=ENV, cwd=ROOT)
    workers: list[int] = []
    try:
        up.wait_line(re.compile(r"worker 1 pid \d+"), 60)
        workers = [int(m.group(1)) for line in up.lines if (m := re.search(r"worker \d pid (\d+)", line))]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        os.kill(up.pid, signal.SIGKILL)
        up.proc.wait(timeout=10)
        wait_for(lambda: not any(_alive(pid) for pid in workers), 10, "up's workers to die with it")
    finally:
        up.kill()
        _kill_all([pid for pid in workers if _alive(pid)])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


@pytest.mark.sglang  # `demo` writes the tiny checkpoint when it is missing, and starts a Cosmos3 worker
def test_make_run_stopped_by_sigterm_stops_what_it_started(model_dir, tmp_path):
    """`make run` (`demo`) stopped by SIGTERM (a CI runner's timeout, `kill`) as by Ctrl-C: the `up` it started
    stops too, with its workers and bridge, instead of holding the default ports for the next `make run`."""
    from tests.conftest import free_port

    ports = [str(free_port()) for _ in range(5)]
    demo = ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "demo", "--once", "--model", str(model_dir),
                         "--request-port", ports[0], "--control-port", ports[1], "--worker-port", ports[2],
                         "--compat-port", ports[3], "--metrics-port", ports[4]], tmp_path / "demo.log", env=ENV, cwd=ROOT)
    started: list[int] = []
    try:
        demo.wait_line(re.compile(r"worker 0 pid \d+"), 120)  # `up` runs, its worker and bridge with it
        started = _descendants(demo.pid)
        assert len(started) >= 2, started
        demo.proc.send_signal(signal.SIGTERM)
        demo.proc.wait(timeout=30)
        wait_for(lambda: not any(_alive(pid) for pid in started), 30, "what `demo` started to stop")
    finally:
        demo.kill()
        _kill_all([pid for pid in started if _alive(pid)])


def test_a_worker_stopped_by_sigint_says_so_in_one_line_not_a_traceback(tmp_path):
    """Ctrl-C in a terminal reaches `up`'s (and `make run`'s) workers too: each printed a KeyboardInterrupt
    traceback on the way out."""
    worker = ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "worker", "--adapter", "null",
                           "--warmup-shapes", "", "--scheduler", "tcp://127.0.0.1:9"], tmp_path / "worker.log",
                          env=ENV, cwd=ROOT)
    try:
        worker.wait_line(re.compile("connecting to"), 60)
        worker.proc.send_signal(signal.SIGINT)
        assert worker.proc.wait(timeout=30) == 130
        wait_for(lambda: any("stopped (SIGINT)" in line for line in worker.lines), 10, "its last line read")
        assert not any("Traceback" in line for line in worker.lines), worker.lines[-20:]
    finally:
        worker.kill()
