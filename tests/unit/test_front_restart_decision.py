"""serve's fronts kept running (service/front_watch.py): when a front that exited is started again (a
table of the pure decision), on which port, and the watch applied to tiny real processes: a front that
exits is started again and counted, and none is started once serve stops."""

from __future__ import annotations

import sys
import threading

import pytest

from candidate_scheduler.service.front_watch import (
    CAP_S,
    FIRST_S,
    STEADY_S,
    FrontSpec,
    FrontWatch,
    plan_restart,
    start_front,
)
from tests.conftest import wait_for


@pytest.mark.parametrize("now,started_at,exited_at,streak,restarts,max_restarts,action,at,next_streak", [
    (1.0, 0.0, 1.0, 0, 0, -1, "wait", 1.0 + FIRST_S, 1),  # the first exit: a short pause
    (1.0 + FIRST_S, 0.0, 1.0, 0, 0, -1, "restart", 1.0 + FIRST_S, 1),  # its pause is over
    (50.0, 0.0, 1.0, 0, 0, -1, "restart", 1.0 + FIRST_S, 1),  # long over (a slow pass): at once
    (10.0, 9.0, 10.0, 1, 1, -1, "wait", 10.0 + 2 * FIRST_S, 2),  # it died again at once: the pause doubles
    (10.0, 9.0, 10.0, 3, 3, -1, "wait", 10.0 + 8 * FIRST_S, 4),
    (10.0, 9.0, 10.0, 6, 6, -1, "wait", 10.0 + CAP_S, 7),  # 32 s capped
    (10.0, 9.0, 10.0, 500, 500, -1, "wait", 10.0 + CAP_S, 501),  # no overflow, no limit by default
    (1000.0, 1000.0 - STEADY_S, 1000.0, 7, 7, -1, "wait", 1000.0 + FIRST_S, 1),  # it had stayed up: pauses over
    (10.0, 9.0, 10.0, 2, 3, 3, "give_up", None, 2),  # its restarts are spent
    (10.0, 9.0, 10.0, 0, 0, 0, "give_up", None, 0),  # 0: never started again
    (10.0, 9.0, 10.0, 2, 2, 3, "wait", 10.0 + 4 * FIRST_S, 3),  # one left
])
def test_when_a_front_that_exited_is_started_again(now, started_at, exited_at, streak, restarts, max_restarts,
                                                   action, at, next_streak):
    plan = plan_restart(now=now, started_at=started_at, exited_at=exited_at, streak=streak, restarts=restarts,
                        max_restarts=max_restarts)
    assert (plan.action, plan.at, plan.streak) == (action, at, next_streak)
    assert plan.why  # the operator's line


def test_nothing_is_started_again_once_serve_stops():
    plan = plan_restart(now=10.0, started_at=0.0, exited_at=5.0, streak=0, restarts=0, serving=False)
    assert plan.action == "stop" and plan.at is None


@pytest.mark.parametrize("flag,asked,address,pinned", [
    ("--bind", "tcp://127.0.0.1:0", "tcp://127.0.0.1:40123", "tcp://127.0.0.1:40123"),  # port 0: the one bound
    ("--bind", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5558"),
    ("--bind", "tcp://0.0.0.0:5558", "tcp://0.0.0.0:5558", "tcp://0.0.0.0:5558"),
    ("--port", "0", "ws://127.0.0.1:40124", "40124"),
    ("--port", "8000", "ws://0.0.0.0:8000", "8000"),
])
def test_a_front_is_started_again_on_the_port_it_bound(flag, asked, address, pinned):
    spec = FrontSpec("compat", "the front", ["python", "-m", "front", flag, asked, "--x"], r"on (\S+)",
                     port_flag=flag)
    again = spec.pinned(address)
    assert again.cmd == ["python", "-m", "front", flag, pinned, "--x"]
    assert spec.cmd[4] == asked  # the spec itself is left as it was


# ---- the watch, on tiny real processes -------------------------------------------------------------

class Counted:
    def __init__(self):
        self.fronts: list[str] = []

    def front_restarted(self, front: str) -> None:
        self.fronts.append(front)


def _front(tmp_path, code: str) -> FrontSpec:
    """A front that says where it listens, then runs `code`; it counts its starts in tmp_path/starts."""
    script = (f"open({str(tmp_path / 'starts')!r}, 'a').write('x'); print('listening on tcp://127.0.0.1:1', "
              f"flush=True); {code}")
    return FrontSpec("openpi", "the test front", [sys.executable, "-c", script, "--port", "0"],
                     r"listening on (\S+)", port_flag="--port", timeout_s=20)


def _starts(tmp_path) -> int:
    path = tmp_path / "starts"
    return len(path.read_text()) if path.exists() else 0


def test_a_front_that_exits_is_started_again_and_counted_until_serve_stops(tmp_path):
    said: list[str] = []
    counted = Counted()
    watch = FrontWatch(metrics=counted, say=said.append, poll_s=0.02, first_s=0.01)
    proc, address = start_front(_front(tmp_path, "raise SystemExit(3)"), watch)
    assert address == "tcp://127.0.0.1:1"
    watch.start()
    try:
        wait_for(lambda: _starts(tmp_path) >= 3, 20, "the front to be started again")
        wait_for(lambda: len(counted.fronts) >= 2, 20, "the restarts to be counted")
        assert set(counted.fronts) == {"openpi"}
        assert any("the test front" in line and "exit code 3" in line for line in said), said
    finally:
        watch.stop()
    starts = _starts(tmp_path)
    assert not watch.running()
    threading.Event().wait(0.1)  # a few of the watch's passes, had it gone on
    assert _starts(tmp_path) == starts


def test_held_the_watch_starts_nothing_again(tmp_path):
    said: list[str] = []
    watch = FrontWatch(say=said.append, first_s=0.01)
    proc, _ = start_front(_front(tmp_path, "import time; time.sleep(60)"), watch)
    try:
        watch.hold()  # what serve's SIGTERM / SIGINT handler does first
        proc.kill()
        proc.wait(timeout=10)
        watch.check()  # the exit is seen
        threading.Event().wait(0.05)  # past the first pause
        watch.check()
        assert _starts(tmp_path) == 1
        assert not any("started again" in line for line in said), said
    finally:
        watch.stop()


def test_after_a_shutdown_the_watch_starts_nothing_again(tmp_path):
    serving = threading.Event()
    serving.set()
    watch = FrontWatch(say=lambda line: None, serving=serving.is_set, first_s=0.01)
    proc, _ = start_front(_front(tmp_path, "import time; time.sleep(60)"), watch)
    try:
        serving.clear()  # the scheduler's loop is ending (SHUTDOWN on its control socket)
        proc.kill()
        proc.wait(timeout=10)
        watch.check()
        threading.Event().wait(0.05)
        watch.check()
        assert _starts(tmp_path) == 1
    finally:
        watch.stop()


def test_stop_ends_a_running_front(tmp_path):
    watch = FrontWatch(say=lambda line: None, poll_s=0.02)
    proc, _ = start_front(_front(tmp_path, "import time; time.sleep(60)"), watch)
    watch.start()
    watch.stop(timeout_s=5)
    assert proc.poll() is not None


def test_a_front_that_does_not_start_refuses_the_start(tmp_path):
    spec = FrontSpec("openpi", "the test front", [sys.executable, "-c", "raise SystemExit(4)"], r"listening on (\S+)",
                     port_flag="--port", timeout_s=20, hint="see its output above")
    with pytest.raises(SystemExit, match=r"the test front did not start \(exit code 4\); see its output above"):
        start_front(spec)
