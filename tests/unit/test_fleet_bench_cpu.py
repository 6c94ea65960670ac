"""The fleet benchmark's CPU figures (bench/fleet.py): each process class's CPU seconds over a run, from
its threads' run time. A thread that ends during the run takes its run time out of a per-process sum
with it, so a process whose thread ran before the run and ended in it (the scheduler's metrics server
answers each scrape on a thread of its own, and a scrape comes right before every run) showed less CPU
than it spent in the run, negative when it was idle: the figures are differences thread by thread."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

from candidate_scheduler.bench import fleet


def _burn(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_thread_that_ran_before_the_run_and_ended_in_it_takes_nothing_off_the_run(monkeypatch):
    release = threading.Event()

    def scrape_thread() -> None:  # a metrics request's thread: it works, then ends a moment later
        _burn(0.15)
        release.wait(10)

    thread = threading.Thread(target=scrape_thread)
    thread.start()
    time.sleep(0.3)  # its work done (0.15 s of CPU), not ended yet

    def fake_drive(endpoint, frames, send_at, timeout_s):
        t0 = time.perf_counter()
        release.set()
        thread.join()
        time.sleep(0.1)  # the run: this process (standing in for the scheduler) idle
        replies = {i: (time.perf_counter(), SimpleNamespace(status="done", candidate_seeds=(i,), metrics={}))
                   for i in range(len(frames))}
        return {"t0": t0, "sent": [t0] * len(frames), "last_sent": t0, "replies": replies}

    monkeypatch.setattr(fleet, "drive", fake_drive)
    monkeypatch.setattr(fleet, "check", lambda *_a: {})
    handle = SimpleNamespace(proc=SimpleNamespace(pid=os.getpid()), workers=[], metrics=None, request="tcp://unused")
    size = fleet.FleetSize(1, 0.01, 2)
    result = fleet.run_workload(handle, size, fleet.Workload("burst", (1,), 2), "cpu", seed=0)
    # the scheduler's figure is this process's CPU in the run: a little, never less than none
    assert 0.0 <= result["cores"]["scheduler"] < 0.5, result["cores"]
    assert result["cores"]["workers"] == 0.0
