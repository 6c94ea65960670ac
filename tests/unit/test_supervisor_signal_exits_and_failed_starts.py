"""`up`'s supervisor (service/supervisor.py): a worker stopped by a signal before its own handlers are in
place (the ~15 s it imports sglang and loads the model) exits by that signal, not with the code its
handlers give; and a start that fails (fork under memory pressure, the interpreter replaced) is a failed
restart, retried after its pause, not a worker silently never started again."""

from __future__ import annotations

import contextlib
import signal
import sys

from candidate_scheduler.service.supervisor import WorkerSupervisor, after_exit
from tests.unit.test_stop_together_stuck_child import _Popen


def test_sigint_before_the_worker_catches_it_is_a_stop_as_130_is():
    # Python exits by the signal itself (-2) when KeyboardInterrupt is not caught: Ctrl-C during the load
    verdict = after_exit(-signal.SIGINT, 0, 3)
    assert verdict.action == after_exit(130, 0, 3).action == "stopped"


def test_sigterm_before_the_worker_catches_it_is_a_leave_as_exit_0_is():
    # an operator's `kill PID` while the worker loads: its handler (leave, exit 0) is not in place yet
    verdict = after_exit(-signal.SIGTERM, 0, 3)
    assert verdict.action == after_exit(0, 0, 3).action == "left"


def test_the_oom_killer_still_gets_a_restart():
    assert after_exit(-signal.SIGKILL, 0, 3).action == "restart"


def test_a_restart_that_cannot_start_is_tried_again_after_its_pause():
    now = [0.0]
    said: list[str] = []
    sup = WorkerSupervisor([[sys.executable, "-c", "raise SystemExit(3)"]], max_restarts=3, delays_s=(1.0, 2.0),
                           say=said.append, clock=lambda: now[0])
    slot = sup.slots[0]
    sup._spawn(slot)
    slot.proc.wait()
    sup.check()  # a crash: due again in 1 s
    assert slot.due == 1.0
    slot.cmd = ["/nonexistent/python-that-is-gone"]  # its start fails
    now[0] = 1.0
    with contextlib.suppress(Exception):  # as the watcher thread takes a pass that raises
        sup.check()
    assert any("python-that-is-gone" in line for line in said), said  # the operator is told why
    slot.cmd = [sys.executable, "-c", "import time; time.sleep(60)"]  # the next try can start
    now[0] = 100.0
    try:
        sup.check()
        assert slot.proc is not None and slot.proc.poll() is None  # started again, not forgotten
        assert slot.restarts == 2  # the failed start spent one restart
    finally:
        sup.stop(timeout_s=5)


def test_a_failed_start_with_no_restarts_left_says_it_gives_up():
    now = [0.0]
    said: list[str] = []
    sup = WorkerSupervisor([[sys.executable, "-c", "raise SystemExit(3)"]], max_restarts=1, delays_s=(1.0,),
                           say=said.append, clock=lambda: now[0])
    slot = sup.slots[0]
    sup._spawn(slot)
    slot.proc.wait()
    sup.check()
    slot.cmd = ["/nonexistent/python-that-is-gone"]
    now[0] = 1.0
    with contextlib.suppress(Exception):
        sup.check()
    assert slot.due is None and slot.proc is None
    assert "--max-restarts" in said[-1], said


class _StuckPopen(_Popen):
    """A worker SIGTERM does not end and SIGKILL does not end at once either (stuck in a GPU driver)."""

    pid = 4242

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if timeout is None and not (self.killed and not self.stuck):  # the real one would block `up` for good
            raise AssertionError("waited for a stuck process without a timeout")
        return super().wait(timeout)


def test_stop_ends_with_a_stuck_worker_and_kills_the_others():
    sup = WorkerSupervisor([["worker-0"], ["worker-1"]], say=lambda line: None)
    stuck, other = _StuckPopen(stuck=True), _StuckPopen(stuck=False)
    sup.slots[0].proc, sup.slots[1].proc = stuck, other
    sup.stop(timeout_s=0.0)  # returns: `up` exits, its tied children die with it
    assert stuck.killed and other.killed and other.returncode == -9
