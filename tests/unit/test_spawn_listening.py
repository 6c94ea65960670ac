"""`spawn_listening` (service/processes.py), which starts the fronts `serve` runs: a child that exits
or stays silent before saying where it listens comes back reaped, so the caller can say how it ended
("did not start (exit code N)"); it read None when asked before the child was reaped."""

from __future__ import annotations

import sys

from candidate_scheduler.service.processes import spawn_listening


def test_a_child_that_exits_before_listening_is_reaped_with_its_exit_code():
    for _ in range(5):  # the race was between its stdout closing and its exit
        proc, address = spawn_listening([sys.executable, "-c", "print('starting'); raise SystemExit(3)"],
                                        r"listening on (\S+)", "test-relay", 30)
        assert address is None and proc.returncode == 3


def test_a_silent_child_is_killed_and_reaped():
    proc, address = spawn_listening([sys.executable, "-c", "import time; time.sleep(60)"],
                                    r"listening on (\S+)", "test-relay", 0.5)
    assert address is None and proc.returncode == -9


def test_a_child_that_listens_gives_its_address():
    proc, address = spawn_listening([sys.executable, "-c", "print('listening on tcp://127.0.0.1:1', flush=True); "
                                     "import time; time.sleep(60)"], r"listening on (\S+)", "test-relay", 30)
    try:
        assert address == "tcp://127.0.0.1:1" and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
