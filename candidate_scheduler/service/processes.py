"""Child processes whose output is drained, so a chatty child (sglang logs a lot) never blocks on a full pipe.

`ChildProcess` (the benchmark and the tests) drains stdout+stderr into a log file and keeps the
lines; `wait_line` blocks until a pattern shows up (the endpoint lines `serve` prints, the bridge's
"listening on"), the child exits, or the timeout passes. `spawn_listening` (what `serve` starts: the
compat bridge, the openpi front) relays a child's output to ours once it has said where it listens.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path


def _prctl():
    """libc's prctl, loaded in the parent: the preexec_fn runs between fork and exec, where an import or
    a dlopen could deadlock on a lock another thread held at the fork."""
    import ctypes

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl


def die_with_parent(parent: int | None = None, prctl=None) -> None:
    """preexec_fn: the child gets SIGKILL when the process that started it dies (Linux prctl), so a
    service child never outlives its Ray actor, even one killed with SIGKILL. `parent`: the pid that
    forked it (`tied_to_this_process()` passes it), so a parent that died before the prctl took
    effect is noticed too: the child would be an orphan that no signal reaches. (The signal comes when
    the forking *thread* ends: start tied children from a thread that lives as long as they should.)"""
    pr_set_pdeathsig = 1
    (prctl or _prctl())(pr_set_pdeathsig, 9)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


# A child's output is read as text; bytes that are not UTF-8 (a native library's log) are escaped, not
# raised on: the exception ended the thread that drained the pipe, and the child blocked on a full pipe.
UNDECODABLE = "backslashreplace"


def _open_log(path: Path):
    try:
        return open(path, "a", errors=UNDECODABLE)
    except OSError:
        return None


def _close_quietly(log) -> None:
    try:
        log.close()
    except OSError:
        pass


def tied_to_this_process():
    """A preexec_fn that ties the child to the calling process (die_with_parent)."""
    return functools.partial(die_with_parent, os.getpid(), _prctl())


class ChildProcess:
    def __init__(self, cmd: list[str], log_path: Path, *, env: dict | None = None, cwd: str | Path | None = None,
                 tied: bool = False, keep_lines: int | None = None):
        """`tied`: killed when this process dies (die_with_parent). `keep_lines`: how many of its latest output
        lines `lines` keeps (the log has every one); None, all: a test reads them all, while a process that
        serves for weeks (a Ray actor's) would hold every line it ever printed."""
        self.cmd = cmd
        self.log_path = Path(log_path)
        self.lines: list[str] = []
        self.keep_lines = keep_lines
        self._cond = threading.Condition()
        # made here, not by whoever picked the path: a Ray actor's node may not be the driver's that did
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors=UNDECODABLE, env=env, cwd=cwd,
                                     preexec_fn=tied_to_this_process() if tied else None)
        self._thread = threading.Thread(target=self._drain, daemon=True, name=f"drain-{self.proc.pid}")
        self._thread.start()

    def _drain(self) -> None:
        # the pipe is read to its end whatever becomes of the log (a full disk, a directory gone): a drain
        # that stopped left the child blocked on its next write once the pipe was full
        log = _open_log(self.log_path)
        try:
            for line in self.proc.stdout:
                if log is not None:
                    try:
                        log.write(line)
                        log.flush()
                    except OSError:
                        _close_quietly(log)
                        log = None
                with self._cond:
                    self.lines.append(line)
                    if self.keep_lines is not None and len(self.lines) >= 2 * self.keep_lines:  # amortised
                        del self.lines[:-self.keep_lines]
                    self._cond.notify_all()
        finally:
            if log is not None:
                _close_quietly(log)
            with self._cond:
                self._cond.notify_all()

    def wait_line(self, pattern: re.Pattern, timeout_s: float) -> re.Match:
        """The first output line matching `pattern` (already printed or still to come)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self.lines:
                    m = pattern.search(line)
                    if m:
                        return m
                if self.proc.poll() is not None and not self._thread.is_alive():
                    raise RuntimeError(f"{' '.join(self.cmd[2:5])} exited ({self.proc.returncode}); log: {self.log_path}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no line {pattern.pattern!r} from {' '.join(self.cmd[2:5])}; log: {self.log_path}")
                self._cond.wait(min(remaining, 0.5))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`."""
        stop_together([self], timeout_s)


def stop_together(procs: list[ChildProcess], timeout_s: float = 10.0) -> None:
    """SIGTERM to every one at once, then SIGKILL to any still running `timeout_s` later: a fleet of
    workers winds down together (one after another, 32 null workers took 6.7 s). TimeoutExpired for one
    that SIGKILL does not end, once every other is stopped."""
    stuck = terminate_then_kill([p.proc for p in procs if p.alive()], timeout_s)
    if stuck:
        raise stuck[0][1]


def exit_cause(returncode: int) -> str:
    """How a child ended, as an operator reads it."""
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"


def terminate_then_kill(popens: list, timeout_s: float) -> list[tuple]:
    """SIGTERM to each at once, SIGKILL to any still running `timeout_s` later, each reaped. Returns
    (popen, TimeoutExpired) of those SIGKILL did not end within 10 s (stuck in the kernel, a GPU driver):
    said after every straggler has its SIGKILL, where waiting on the first for good spared the rest."""
    for p in popens:
        p.terminate()
    deadline = time.monotonic() + timeout_s
    killed = []
    for p in popens:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            killed.append(p)
    stuck = []
    for p in killed:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired as exc:
            stuck.append((p, exc))
    return stuck


def spawn_listening(cmd: list[str], pattern: str, name: str, timeout_s: float,
                    env: dict[str, str] | None = None, on_start=None) -> tuple[subprocess.Popen, str | None]:
    """Start `cmd` and wait until it prints a line matching `pattern` (one group: the address it
    listens on). Returns (process, address); address is None when the child exited or stayed silent
    for `timeout_s`, and a silent child is killed. Every other line of its stdout is relayed to ours,
    from a daemon thread named `name`. `env`: variables added to this process's environment.

    The child dies with this process: a scheduler killed outright (SIGKILL, the OOM killer, Ray
    killing its actor) left its compat bridge or openpi front holding their ports, and the next run
    on the same ports (what a supervisor restarts) could not start its own.

    `on_start(proc)`: called as soon as the child exists, before the wait: a supervisor that stops
    meanwhile (service/front_watch.py) can then end a child that is still starting."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, errors=UNDECODABLE,
                            env=None if env is None else {**os.environ, **env}, preexec_fn=tied_to_this_process())
    if on_start is not None:
        on_start(proc)
    listening = threading.Event()
    found: list[str] = []

    def relay() -> None:
        for line in proc.stdout:
            if not listening.is_set():
                m = re.search(pattern, line)
                if m:
                    found.append(m.group(1))
                    listening.set()
                    continue
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except (OSError, ValueError):  # our stdout gone (closed, a broken pipe): keep draining the child's
                pass
        listening.set()

    threading.Thread(target=relay, daemon=True, name=name).start()
    listening.wait(timeout_s)
    if not found:
        # a child that closed its stdout is exiting, a moment before it can be reaped: wait that moment,
        # so the caller can say how it exited; a silent one is killed at once (-9)
        try:
            proc.wait(timeout=2.0 if listening.is_set() else 0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return proc, None
    return proc, found[0]
