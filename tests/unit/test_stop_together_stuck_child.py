"""`stop_together` (service/processes.py) with a child that SIGKILL does not end at once (stuck in the
kernel, as a process hung in a GPU driver is): every other child is still killed, not left running
because waiting for the stuck one raised first."""

from __future__ import annotations

import subprocess

import pytest

from candidate_scheduler.service.processes import stop_together


class _Popen:
    """Ignores SIGTERM; `stuck`: SIGKILL does not end it within any wait either."""

    def __init__(self, stuck: bool):
        self.stuck = stuck
        self.killed = False
        self.returncode = None

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout=None):
        if self.killed and not self.stuck:
            self.returncode = -9
            return -9
        raise subprocess.TimeoutExpired("child", timeout)


class _Child:
    def __init__(self, stuck: bool):
        self.proc = _Popen(stuck)

    def alive(self) -> bool:
        return self.proc.returncode is None


def test_a_child_stuck_after_sigkill_does_not_spare_the_others():
    stuck, other = _Child(stuck=True), _Child(stuck=False)
    with pytest.raises(subprocess.TimeoutExpired):  # said, not hidden
        stop_together([stuck, other], timeout_s=0.0)
    assert other.proc.killed and other.proc.returncode == -9


def test_a_launcher_with_a_stuck_worker_still_stops_its_scheduler(tmp_path):
    from candidate_scheduler.service.launcher import Launcher

    class _Stoppable(_Child):
        def stop(self, timeout_s: float = 10.0) -> None:
            stop_together([self], timeout_s)

    launcher = Launcher(tmp_path)
    scheduler, worker = _Stoppable(stuck=False), _Stoppable(stuck=True)
    launcher.procs += [scheduler, worker]
    launcher._workers.append(worker)
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.close(timeout_s=0.0)
    assert scheduler.proc.killed and scheduler.proc.returncode == -9
