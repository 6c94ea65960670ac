"""`up` keeps its local workers running (service/supervisor.py): which exits start a worker again, after
what pause, how many times; and the supervisor applied to real (tiny) processes."""

from __future__ import annotations

import sys
import time

import pytest

from candidate_scheduler.service.supervisor import RESTART_DELAYS_S, WorkerSupervisor, after_exit


@pytest.mark.parametrize("code,restarts,max_restarts,action,delay", [
    (0, 0, 3, "left", 0.0),  # an operator's worker-leave, or a SIGTERM: not undone
    (130, 0, 3, "stopped", 0.0),  # Ctrl-C reached it, as it reaches `up`
    (1, 0, 3, "restart", RESTART_DELAYS_S[0]),  # WorkerFailed, a traceback
    (-9, 1, 3, "restart", RESTART_DELAYS_S[1]),  # the OOM killer: the pause grows
    (-11, 2, 3, "restart", RESTART_DELAYS_S[2]),
    (1, 3, 3, "give_up", 0.0),  # its restarts are spent
    (1, 0, 0, "give_up", 0.0),  # --max-restarts 0: never started again
    (1, 40, -1, "restart", RESTART_DELAYS_S[-1]),  # -1: no limit, and the pause stops growing
])
def test_which_exits_start_a_worker_again(code, restarts, max_restarts, action, delay):
    verdict = after_exit(code, restarts, max_restarts)
    assert (verdict.action, verdict.delay_s) == (action, delay)
    assert verdict.why  # the line the operator reads


def test_the_verdict_names_the_cause():
    assert "killed by signal 9" in after_exit(-9, 0, 3).why
    assert "exit code 2" in after_exit(2, 0, 3).why
    assert "restart 1 of 3" in after_exit(2, 0, 3).why
    assert "--max-restarts" in after_exit(2, 3, 3).why


def _cmd(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _until(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError("condition never held")


def test_a_crashing_worker_is_started_again_until_its_restarts_are_spent_and_one_that_left_is_not():
    said: list[str] = []
    crash, leave = _cmd("import sys; sys.exit(3)"), _cmd("pass")
    sup = WorkerSupervisor([crash, leave], max_restarts=2, delays_s=(0.01,), say=said.append, poll_s=0.01)
    sup.start()
    try:
        _until(lambda: any("restart(s) (--max-restarts) are spent" in line for line in said))
        time.sleep(0.1)  # nothing more happens after the last verdict
    finally:
        sup.stop()
    exits0 = [line for line in said if line.startswith("candidate-scheduler: worker 0 ") and "exited" in line]
    assert len(exits0) == 3, said  # the first run and its two restarts
    assert sum("worker 0 started again" in line for line in said) == 2
    assert [line for line in said if "worker 1" in line] == \
        [next(line for line in said if "worker 1" in line)]  # one line: it left, and stayed gone
    assert "it left (exit 0)" in next(line for line in said if "worker 1" in line)
    assert sup.slots[0].restarts == 2 and sup.slots[1].restarts == 0


def test_stop_ends_the_running_workers_and_no_restart_follows():
    said: list[str] = []
    sup = WorkerSupervisor([_cmd("import time; time.sleep(60)")] * 2, max_restarts=-1, delays_s=(0.01,),
                           say=said.append, poll_s=0.01)
    sup.start()
    procs = [s.proc for s in sup.slots]
    assert all(p.poll() is None for p in procs)
    started = time.monotonic()
    sup.stop(timeout_s=5)
    assert time.monotonic() - started < 5  # SIGTERM ended them: no kill timeout waited out
    assert all(p.returncode is not None for p in procs)
    time.sleep(0.1)
    assert not any(" started again" in line for line in said), said


def test_a_restarted_worker_gets_its_graceful_stop_too():
    """Restarted workers are tied to the watcher thread (the kill signal comes when the thread that
    forked them ends): the thread must outlive them, or `stop` would SIGKILL them mid-leave."""
    said: list[str] = []
    leaves = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0))); "
    first = [sys.executable, "-c", "import sys; sys.exit(1)"]
    sup = WorkerSupervisor([first], max_restarts=1, delays_s=(0.01,), say=said.append, poll_s=0.01)
    sup.start()
    sup.slots[0].cmd = [sys.executable, "-c", leaves + "time.sleep(60)"]  # what its restart runs
    try:
        _until(lambda: any("started again" in line for line in said))
        time.sleep(0.3)  # its SIGTERM handler is in place
    finally:
        proc = sup.slots[0].proc
        sup.stop(timeout_s=5)
    assert proc.returncode == 0  # it left on its own, not killed by the watcher thread's end (-9)
