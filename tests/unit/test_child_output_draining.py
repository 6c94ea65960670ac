"""A child's output is drained whatever it prints and wherever its log goes (service/processes.py): a drain
or relay thread that dies leaves the child blocked on a full pipe (64 KiB) for good -- a worker under Ray
stops serving, the compat bridge stops answering -- and `wait_line` misses lines already printed."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from candidate_scheduler.service.processes import ChildProcess, spawn_listening

# More than a pipe holds (64 KiB on Linux), then the line a launcher waits for, then a clean exit.
CHATTY = "import sys\nfor i in range(4000): print('x' * 60, i)\nprint('READY', flush=True)\n"
# A line that is not UTF-8 (a native library's log, a path in another encoding) first.
UNDECODABLE = "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe not utf-8\\n'); sys.stdout.flush()\n"


def _drained(proc: ChildProcess) -> None:
    assert proc.wait_line(re.compile("READY"), 10).group(0) == "READY"
    assert proc.proc.wait(timeout=10) == 0  # it could write everything: nothing blocked it


def test_a_full_disk_under_the_log_does_not_block_the_child():
    # /dev/full: every write fails with ENOSPC, as a log on a full disk does
    _drained(ChildProcess([sys.executable, "-c", CHATTY], Path("/dev/full")))


def test_a_log_directory_that_does_not_exist_yet_is_made(tmp_path):
    # a Ray actor on another node than the driver that made the log directory
    log = tmp_path / "not-made-here" / "worker.log"
    proc = ChildProcess([sys.executable, "-c", CHATTY], log)
    _drained(proc)
    proc._thread.join(timeout=5)
    assert "READY" in log.read_text()


def test_output_that_is_not_utf8_is_drained_and_logged(tmp_path):
    log = tmp_path / "child.log"
    proc = ChildProcess([sys.executable, "-c", UNDECODABLE + CHATTY], log)
    _drained(proc)
    proc._thread.join(timeout=5)
    assert "not utf-8" in proc.lines[0]  # kept, its bad bytes escaped
    assert "READY" in log.read_text()


def test_a_front_that_prints_something_not_utf8_before_listening_is_still_found():
    proc, address = spawn_listening(
        [sys.executable, "-c", UNDECODABLE + "print('listening on tcp://127.0.0.1:1', flush=True)\n" + CHATTY],
        r"listening on (\S+)", "test-relay", 10)
    try:
        assert address == "tcp://127.0.0.1:1"
        assert proc.wait(timeout=10) == 0  # its later output relayed, not left to fill the pipe
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_front_whose_output_is_not_utf8_after_listening_keeps_being_relayed():
    _listens_then_exits_cleanly(UNDECODABLE + CHATTY)


def test_a_front_keeps_being_drained_when_our_own_stdout_is_gone(monkeypatch):
    # `serve` with its stdout closed (a pipe to a reader that went away): relaying fails, draining must not
    gone = io.StringIO()
    gone.close()
    monkeypatch.setattr(sys, "stdout", gone)
    _listens_then_exits_cleanly(CHATTY)


def _listens_then_exits_cleanly(after: str) -> None:
    """A front that says it listens, then runs `after` (more output than a pipe holds): found, and drained
    to its end (it exits 0 rather than blocking on a full pipe)."""
    proc, address = spawn_listening(
        [sys.executable, "-c", "print('listening on tcp://127.0.0.1:1', flush=True)\n" + after],
        r"listening on (\S+)", "test-relay", 10)
    try:
        assert address == "tcp://127.0.0.1:1"
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_long_lived_child_keeps_its_latest_lines_in_memory_and_every_line_in_its_log(tmp_path):
    """A Ray actor's `serve` or worker runs for weeks: `lines` held every line it ever printed."""
    child = ChildProcess([sys.executable, "-c", "for i in range(1000): print(i)"], tmp_path / "c.log", keep_lines=10)
    assert child.proc.wait(timeout=10) == 0
    child._thread.join(10)
    assert 10 <= len(child.lines) < 20 and child.lines[-1] == "999\n"
    assert (tmp_path / "c.log").read_text().splitlines() == [str(i) for i in range(1000)]
