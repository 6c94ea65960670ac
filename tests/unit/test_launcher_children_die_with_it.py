"""What `Launcher` starts (service/launcher.py: the benchmarks' and tests' schedulers and workers) dies
with the process that started it, even one killed outright (SIGKILL, a runner's timeout, the OOM killer):
else its workers held the GPU and its scheduler the ports for every later run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# a driver that starts one long child through a Launcher, says its pid, and waits to be killed
DRIVER = r"""
import sys, time
from candidate_scheduler.service.launcher import Launcher
launcher = Launcher(sys.argv[1])
child = launcher.start([sys.executable, "-c", "import time; time.sleep(60)"], "sleeper")
print(child.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # dead; only its reaping is left (to whoever adopted it)


def test_a_launchers_children_die_when_it_is_killed_outright(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "logs")], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2])
    pid = None
    try:
        pid = int(driver.stdout.readline())
        assert not _gone(pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid), "the launcher's child outlived it"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_started_from_a_short_lived_thread_outlives_that_thread(tmp_path):
    # a test restarts a scheduler from a thread that ends at once (tests/integration/test_scheduler_death.py):
    # tied to that thread, the child would be killed as the thread ends
    from candidate_scheduler.service.launcher import Launcher

    with Launcher(tmp_path / "logs") as launcher:
        started = []
        thread = threading.Thread(target=lambda: started.append(
            launcher.start([sys.executable, "-c", "import time; time.sleep(60)"], "sleeper")))
        thread.start()
        thread.join()
        (child,) = started
        deadline = time.monotonic() + 0.2  # the thread's end signals at once when the child is tied
        while child.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert child.alive()
