"""Child processes stopped together (service/processes.stop_together): a fleet winds down at once."""

from __future__ import annotations

import re
import sys
import time

from candidate_scheduler.service.processes import ChildProcess, stop_together

# On SIGTERM: print when it came, take a second to wind down, print when it leaves. "--stubborn": ignore it.
CHILD = r"""
import signal, sys, time
def bye(*_):
    print("term", time.monotonic(), flush=True)
    time.sleep(1.0)
    print("exit", time.monotonic(), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if "--stubborn" in sys.argv else bye)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _child(tmp_path, n: int, *flags: str) -> ChildProcess:
    proc = ChildProcess([sys.executable, "-c", CHILD, *flags], tmp_path / f"{n}.log")
    proc.wait_line(re.compile("ready"), 30)
    return proc


def _at(proc: ChildProcess, what: str) -> float:
    return float(next(line.split()[1] for line in proc.lines if line.startswith(what)))


def test_every_child_is_told_to_stop_before_any_has_finished_winding_down(tmp_path):
    children = [_child(tmp_path, n) for n in range(3)]
    stop_together(children, timeout_s=20)
    assert all(c.proc.returncode == 0 for c in children)
    time.sleep(0.2)  # the drain threads read the last lines
    # one after another, each would have been told only after the one before had left
    assert max(_at(c, "term") for c in children) < min(_at(c, "exit") for c in children)


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path):
    stubborn, willing = _child(tmp_path, 0, "--stubborn"), _child(tmp_path, 1)
    started = time.monotonic()
    stop_together([stubborn, willing], timeout_s=1.5)
    assert stubborn.proc.returncode == -9 and willing.proc.returncode == 0
    assert time.monotonic() - started >= 1.5
