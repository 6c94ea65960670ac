"""`serve`'s fronts kept running: the sglang compat bridge and the openpi websocket, started again when
they exit while `serve` runs (as `up`'s workers are: service/supervisor.py).

`serve` runs each front as a child process beside its loop (commands._serve). One that exited (a crash,
the OOM killer's SIGKILL, an operator's `kill`, an sglang client's ShutdownReq to the bridge) left every
client of that front refused at connect for good, and nothing said so. Now the exit is said on stderr
(which front, its pid, how it ended; its own output is relayed to serve's stdout) and the front is
started again with the same command line: the same address, keys and flags, and a port asked as 0
pinned to the one it bound, which is the one its clients were told. The pause before a start doubles
from FIRST_S up to CAP_S while the front keeps dying, and starts over once it has stayed up STEADY_S.
There is no limit by default: a front that cannot start is tried, said and counted
(candidate_scheduler_front_restarts_total) again and again, never left silently down.

Once `serve` stops, nothing is started again: its SIGTERM / SIGINT handlers `hold` the watch first (a
Ctrl-C reaches the fronts too, and they exit while the loop still drains), a SHUTDOWN makes `serving`
false, and `stop` (serve's `finally`) ends every front, one still starting included.

`plan_restart` decides (a value, tested as a table; the clock is passed in); `FrontWatch` applies it on
a thread of its own. Restarted fronts are tied to that thread (die_with_parent: the signal comes when the
forking thread ends), so it lives until `stop`.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from candidate_scheduler.service import processes

log = logging.getLogger(__name__)

FIRST_S = 0.5  # the pause before the first restart: a front killed once is back at once
CAP_S = 30.0  # the longest pause: a front that cannot start (its port taken) does not spin
STEADY_S = 60.0  # up this long, a front had recovered: its next exit starts the pauses over
POLL_S = 0.2  # how often exits are looked for
STOP_TIMEOUT_S = 5.0  # SIGTERM to SIGKILL when serve stops (what serve always gave its fronts)


@dataclass(frozen=True)
class RestartPlan:
    action: str  # "restart" (now) | "wait" (until `at`) | "give_up" | "stop" (serve is stopping)
    at: float | None  # when it is started ("restart", "wait")
    streak: int  # quick exits in a row once it is started: the next pause's exponent
    why: str = ""


def plan_restart(*, now: float, started_at: float, exited_at: float, streak: int, restarts: int,
                 serving: bool = True, max_restarts: int = -1, first_s: float = FIRST_S, cap_s: float = CAP_S,
                 steady_s: float = STEADY_S) -> RestartPlan:
    """What to do about a front started at `started_at` that exited at `exited_at`, after `restarts`
    restarts, `streak` of them after quick exits (module docstring). `max_restarts` < 0: no limit."""
    if not serving:
        return RestartPlan("stop", None, streak, "serve is stopping; not started again")
    if 0 <= max_restarts <= restarts:
        return RestartPlan("give_up", None, streak, f"not started again: its {max_restarts} restart(s) are spent")
    if exited_at - started_at >= steady_s:
        streak = 0
    delay = min(cap_s, first_s * 2.0 ** min(streak, 64))  # bounded exponent: no float overflow after long outages
    at = exited_at + delay
    return RestartPlan("restart" if now >= at else "wait", at, streak + 1,
                       f"starting it again in {delay:g} s (restart {restarts + 1})")


@dataclass(frozen=True)
class FrontSpec:
    """How one front is started, and started again."""

    name: str  # its api label in front_restarts_total: "compat" (the sglang bridge) | "openpi"
    what: str  # what the operator reads: "the sglang compat bridge"
    cmd: list[str]
    pattern: str  # the line it prints once it listens; one group: its address
    port_flag: str  # the flag whose value holds its port ("--port 0") or endpoint ("--bind tcp://host:0")
    thread_name: str = "front-log"  # the thread that relays its output
    timeout_s: float = 60.0  # to say where it listens
    env: dict[str, str] | None = field(default=None, repr=False)  # holds a secret key: never printed
    hint: str = ""  # said when it does not start at all

    def spawn(self, on_start: Callable[[subprocess.Popen], None] | None = None) -> tuple[subprocess.Popen, str | None]:
        args = (list(self.cmd), self.pattern, self.thread_name, self.timeout_s)
        if on_start is None:
            return processes.spawn_listening(*args, env=self.env)
        return processes.spawn_listening(*args, env=self.env, on_start=on_start)

    def pinned(self, address: str) -> FrontSpec:
        """This front started again where it listens now: a port asked as 0 becomes the one it bound."""
        m = re.search(r":(\d+)/?$", address or "")
        if m is None or self.port_flag not in self.cmd[:-1]:
            return self
        cmd = list(self.cmd)
        i = cmd.index(self.port_flag) + 1
        if cmd[i] == "0":
            cmd[i] = m.group(1)
        elif cmd[i].endswith(":0"):
            cmd[i] = cmd[i][:-1] + m.group(1)
        return replace(self, cmd=cmd)


def start_front(spec: FrontSpec, watch: FrontWatch | None = None) -> tuple[subprocess.Popen, str]:
    """Start `spec` on the calling thread and wait until it listens; then `watch` keeps it running.
    SystemExit (one line) when it does not start: `serve` does not run without a front it was asked for."""
    proc, address = spec.spawn()
    if address is None:
        raise SystemExit(f"{spec.what} did not start (exit code {proc.returncode}); {spec.hint}")
    if watch is not None:
        watch.add(spec, proc, address)
    return proc, address


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Front:
    def __init__(self, spec: FrontSpec, proc: subprocess.Popen | None, address: str, now: float):
        self.spec = spec.pinned(address)
        self.address = address
        self.proc = proc
        self.started_at = now
        self.exited_at: float | None = None  # None: running (or starting)
        self.streak = 0
        self.restarts = 0
        self.given_up = False


class FrontWatch:
    """Keeps serve's fronts running (`plan_restart`); `say` prints a line for the operator. `metrics`:
    SchedulerMetrics (front_restarted), or None when /metrics is off. `serving`: False once serve stops."""

    def __init__(self, *, metrics=None, say: Callable[[str], None] = _to_stderr,
                 serving: Callable[[], bool] = lambda: True, max_restarts: int = -1, first_s: float = FIRST_S,
                 cap_s: float = CAP_S, steady_s: float = STEADY_S, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = POLL_S):
        self.metrics = metrics
        self.say = say
        self.serving = serving
        self.max_restarts = max_restarts
        self.first_s, self.cap_s, self.steady_s = first_s, cap_s, steady_s
        self.clock = clock
        self.poll_s = poll_s
        self._fronts: list[_Front] = []
        self._held = threading.Event()  # no more starts (set from a signal handler: an Event only)
        self._stopped = False  # stop() has collected the fronts: a child started after it is ended at once
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, spec: FrontSpec, proc: subprocess.Popen | None, address: str) -> None:
        with self._lock:
            self._fronts.append(_Front(spec, proc, address, self.clock()))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="front-watch", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def hold(self) -> None:
        """No front is started again from now on (serve is stopping). Safe in a signal handler."""
        self._held.set()

    def _serving(self) -> bool:
        return not self._held.is_set() and self.serving()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad pass, or its fronts die with it
                log.exception("the front watch failed in a pass; it goes on")

    def check(self) -> None:
        """One pass: notice exits, start again the fronts that are due."""
        for front in list(self._fronts):
            if front.given_up:
                continue
            now = self.clock()
            if front.exited_at is None:
                if front.proc is None or (code := front.proc.poll()) is None:
                    continue
                front.exited_at = now
                plan = self._plan(front, now)
                if plan.action != "stop":  # a front that ends with serve is no news
                    self.say(f"candidate-scheduler: {front.spec.what} (pid {front.proc.pid}, {front.address}) "
                             f"exited ({processes.exit_cause(code)}; its output is in serve's stdout): {plan.why}")
            else:
                plan = self._plan(front, now)
            if plan.action == "give_up":
                front.given_up = True
            if plan.action == "restart":
                self._restart(front, plan)

    def _plan(self, front: _Front, now: float) -> RestartPlan:
        return plan_restart(now=now, started_at=front.started_at, exited_at=front.exited_at, streak=front.streak,
                            restarts=front.restarts, serving=self._serving(), max_restarts=self.max_restarts,
                            first_s=self.first_s, cap_s=self.cap_s, steady_s=self.steady_s)

    def _restart(self, front: _Front, plan: RestartPlan) -> None:
        front.streak = plan.streak
        front.restarts += 1
        if self.metrics is not None:
            self.metrics.front_restarted(front.spec.name)

        def starting(proc: subprocess.Popen) -> None:
            with self._lock:
                front.proc = proc
                if self._stopped:  # serve stopped while this start was decided: it ends at once
                    proc.terminate()

        try:
            proc, address = front.spec.spawn(on_start=starting)
        except (OSError, subprocess.SubprocessError) as exc:  # fork under memory pressure: tried again later
            front.proc, front.started_at = None, self.clock()
            front.exited_at = front.started_at
            self.say(f"candidate-scheduler: {front.spec.what} could not be started again ({exc})")
            return
        now = self.clock()
        if self._stopped:  # ended by `starting` (or by stop): nothing to say
            return
        if address is None:
            front.started_at = front.exited_at = now
            if self._serving():
                self.say(f"candidate-scheduler: {front.spec.what} did not start again (exit code {proc.returncode}; "
                         f"its output is in serve's stdout); trying again")
            return
        front.started_at, front.exited_at = now, None
        self.say(f"candidate-scheduler: {front.spec.what} started again, pid {proc.pid}, on {address}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """No more starts; SIGTERM every front, SIGKILL what is left after `timeout_s`."""
        self._held.set()
        with self._lock:
            self._stopped = True
            procs = [f.proc for f in self._fronts if f.proc is not None and f.proc.poll() is None]
        # bounded: a front SIGKILL does not end held serve's exit for good
        for p, _ in processes.terminate_then_kill(procs, timeout_s):
            self.say(f"candidate-scheduler: front pid {p.pid} did not end 10 s after SIGKILL; not waiting for it")
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
