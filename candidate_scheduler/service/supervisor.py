"""`up`'s local workers, kept running: a worker that dies is started again, as Ray does for `up --ray`.

A worker process ends for one of three reasons, and only one of them calls for a new one:
- it left on purpose and exited 0 (an operator's `worker-leave`, a SIGTERM from outside `up`; killed by
  that SIGTERM while it starts, before its handler is in place): starting it again would undo the
  operator; under `up` nothing else would ever take it away;
- it was stopped by SIGINT (130, or killed by it while it starts: a terminal's Ctrl-C reaches `up`'s
  workers too, and `up` stops with them);
- anything else (a crash, `WorkerFailed`, the OOM killer's SIGKILL, a device error): started again after
  a growing pause, at most `max_restarts` times per worker (negative: no limit), under the same worker
  id, so the scheduler takes the new process for a restart of the old one and retries what it held at
  once instead of after the heartbeat timeout.

`after_exit` decides (a value, tested as a table); `WorkerSupervisor` applies it on a thread of its
own. Restarted workers are tied to that thread (`die_with_parent`: the signal comes when the forking
thread ends), so it lives until `stop` has seen every worker exit.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from candidate_scheduler.service.processes import exit_cause, terminate_then_kill, tied_to_this_process

log = logging.getLogger(__name__)

RESTART_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # a worker that cannot start does not spin
POLL_S = 0.2  # how often exits are looked for: well under the first pause
SIGINT_EXIT = 130


@dataclass(frozen=True)
class ExitVerdict:
    action: str  # "restart" | "left" | "stopped" | "give_up"
    delay_s: float = 0.0
    why: str = ""


def after_exit(returncode: int, restarts: int, max_restarts: int,
               delays_s: Sequence[float] = RESTART_DELAYS_S) -> ExitVerdict:
    """What to do about a worker that exited with `returncode` after `restarts` restarts (module docstring)."""
    if returncode == 0:
        return ExitVerdict("left", why="it left (exit 0): an operator's worker-leave or a SIGTERM; not started again")
    # the same signals before the worker's handlers are in place (it imports sglang, loads the model): it
    # exits by the signal itself, which an operator meant as much as the handled one
    if returncode == -signal.SIGTERM:
        return ExitVerdict("left", why="it was stopped by SIGTERM while it started; not started again")
    if returncode in (SIGINT_EXIT, -signal.SIGINT):
        return ExitVerdict("stopped", why="it was stopped by SIGINT; not started again")
    return _again(exit_cause(returncode), restarts, max_restarts, delays_s)


def _again(cause: str, restarts: int, max_restarts: int, delays_s: Sequence[float]) -> ExitVerdict:
    """A worker that failed (`cause`) after `restarts` restarts: started again after its pause, or given up."""
    if 0 <= max_restarts <= restarts:
        return ExitVerdict("give_up", why=f"{cause}; not started again: its {max_restarts} restart(s) (--max-restarts) "
                                          "are spent")
    delay = delays_s[min(restarts, len(delays_s) - 1)]
    return ExitVerdict("restart", delay, f"{cause}; starting it again in {delay:g} s (restart {restarts + 1} of "
                                         f"{'unlimited' if max_restarts < 0 else max_restarts})")


class _Slot:
    def __init__(self, index: int, cmd: list[str]):
        self.index = index
        self.cmd = cmd
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.due: float | None = None  # when it is started again (None: running, or not to be started again)


class WorkerSupervisor:
    """Starts `up`'s workers and keeps them running (`after_exit`). `say` prints a line for the operator."""

    def __init__(self, cmds: Sequence[list[str]], *, max_restarts: int = 3,
                 delays_s: Sequence[float] = RESTART_DELAYS_S, say: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S):
        self.slots = [_Slot(i, list(cmd)) for i, cmd in enumerate(cmds)]
        self.max_restarts = max_restarts
        self.delays_s = tuple(delays_s)
        self.say = say
        self.clock = clock
        self.poll_s = poll_s
        self._stopping = threading.Event()  # no more starts
        self._done = threading.Event()  # every worker has exited: the watcher thread may end (module docstring)
        self._lock = threading.Lock()  # a start on the watcher thread against `stop` on the main one
        self._thread: threading.Thread | None = None

    def start(self, on_start: Callable[[int, subprocess.Popen], None] | None = None) -> None:
        """Start every worker (on the calling thread: the main one, which lives as long as `up`), then watch them."""
        for slot in self.slots:
            self._spawn(slot)
            if on_start is not None:
                on_start(slot.index, slot.proc)
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)
        self._thread.start()

    @property
    def pids(self) -> list[int | None]:
        return [None if s.proc is None else s.proc.pid for s in self.slots]

    def _spawn(self, slot: _Slot) -> None:
        slot.proc = subprocess.Popen(slot.cmd, preexec_fn=tied_to_this_process())

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            if self._stopping.is_set():
                continue
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive one bad pass, or restarted workers die with it
                log.exception("the worker supervisor failed in a pass; it goes on")

    def check(self) -> None:
        """One pass: notice exits, start again the workers that are due."""
        now = self.clock()
        for slot in self.slots:
            with self._lock:
                if self._stopping.is_set():
                    return
                if slot.due is not None:
                    if now >= slot.due:
                        slot.due = None
                        slot.restarts += 1
                        try:
                            self._spawn(slot)
                        except (OSError, subprocess.SubprocessError) as exc:
                            # (fork under memory pressure, the interpreter replaced) a failed restart: left
                            # undecided, the worker was never started again and nothing said so
                            slot.proc = None
                            verdict = _again(f"could not be started ({exc})", slot.restarts, self.max_restarts,
                                             self.delays_s)
                            self.say(f"candidate-scheduler: worker {slot.index} {verdict.why}")
                            if verdict.action == "restart":
                                slot.due = now + verdict.delay_s
                            continue
                        self.say(f"candidate-scheduler: worker {slot.index} started again, pid {slot.proc.pid}")
                    continue
                if slot.proc is None or (code := slot.proc.poll()) is None:
                    continue
                verdict = after_exit(code, slot.restarts, self.max_restarts, self.delays_s)
                self.say(f"candidate-scheduler: worker {slot.index} (pid {slot.proc.pid}) exited: {verdict.why}")
                slot.proc = None
                if verdict.action == "restart":
                    slot.due = now + verdict.delay_s

    def stop(self, timeout_s: float = 10.0) -> None:
        """No more starts; SIGTERM every worker (they leave gracefully), SIGKILL what is left after `timeout_s`."""
        with self._lock:
            self._stopping.set()
        # bounded: a worker SIGKILL does not end (stuck in a GPU driver) held `up`, and the kills of the
        # workers after it, for good
        for p, _ in terminate_then_kill([s.proc for s in self.slots if s.proc is not None], timeout_s):
            self.say(f"candidate-scheduler: worker pid {p.pid} did not end 10 s after SIGKILL; not waiting for it")
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
