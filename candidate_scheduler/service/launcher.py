"""Local services for the benchmarks and the tests: `serve`, `worker` and compat-bridge child processes.

Every port is picked by the OS (port 0) and read back from the endpoint lines the child prints, so
runs never collide with each other or with a service already listening on the default ports. Each
child's output goes to its own log file under `log_dir`; `Launcher.close()` stops everything it
started, newest first (workers before their scheduler).

    with Launcher(tmp_dir) as launcher:
        sched = launcher.scheduler("--policy", "reject", metrics=True)   # extra `serve` flags pass through
        launcher.worker(sched, "cosmos3", 8, model=model_dir)
        sched.wait_workers(1)
        with sched.client() as client: ...
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candidate_scheduler.service.processes import ChildProcess, stop_together

ROOT = Path(__file__).resolve().parents[2]

ENDPOINT_LINE = re.compile(
    r"candidate-scheduler: (request endpoint|control endpoint|worker link|metrics|sglang compat)\s+(\S+)")
# `serve` prints the compat line last, after the bridge (when there is one) listens.
LAST_SERVE_LINE = re.compile(r"candidate-scheduler: sglang compat")
BRIDGE_READY = re.compile(r"candidate-scheduler compat bridge: listening on (\S+)")


def child_env(base: dict | None = None) -> dict:
    """The environment of a local child: offline Hugging Face, no Cosmos3 guardrail models, unbuffered
    output (the endpoint lines must arrive at once) and no tokenizer thread pools."""
    env = dict(os.environ if base is None else base)
    env.update(HF_HUB_OFFLINE="1", SGLANG_DISABLE_COSMOS3_GUARDRAILS="1", PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    return env


@dataclass
class SchedulerHandle:
    """A running `serve` process, its endpoints (None when off) and the workers started for it."""

    proc: ChildProcess
    request: str
    control: str
    worker: str
    metrics: str | None
    compat: str | None
    workers: list[ChildProcess] = field(default_factory=list)
    keys: Any = None  # an admin's ClientKeys when the scheduler takes keys (--curve-dir)

    def same_ports(self) -> list[str]:
        """The `serve` flags of a next run on this one's ports (a restart clients and workers find)."""
        return [flag for name in ("request", "control", "worker")
                for flag in (f"--{name}-port", getattr(self, name).rsplit(":", 1)[1])]

    def client(self, **kwargs):
        from candidate_scheduler.service.client import Client

        return Client(self.request, self.control, **{"keys": self.keys, **kwargs})

    def wait_workers(self, n: int, timeout_s: float = 120.0, poll_s: float = 0.05) -> dict:
        """Poll STATS until at least `n` workers are registered; returns that STATS detail. Fails at
        once when the scheduler has exited, or when every worker started for it has exited."""
        def check() -> None:
            if not self.proc.alive():
                raise RuntimeError(f"the scheduler exited ({self.proc.proc.returncode}); log: {self.proc.log_path}")
            if self.workers and not any(w.alive() for w in self.workers):
                w = self.workers[-1]
                raise RuntimeError(f"every worker exited (last: {w.proc.returncode}); log: {w.log_path}")

        with self.client() as c:
            return wait_for_workers(c, n, timeout_s, poll_s, check, f"log: {self.proc.log_path}")


def wait_for_workers(client, n: int, timeout_s: float, poll_s: float, check=None, where: str = "") -> dict:
    """Poll `client`'s STATS until at least `n` workers are registered; that STATS detail. `check()`
    runs before each poll and raises when waiting longer is pointless (a process that exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        try:
            stats = client.stats()
            if len(stats["workers"]) >= n:
                return stats
        except TimeoutError:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{n} worker(s) did not register within {timeout_s:.0f} s" + (f"; {where}" if where else ""))
        time.sleep(poll_s)


class BridgeProcess(ChildProcess):
    """A compat bridge (`python -m candidate_scheduler.compat.bridge`), started and listening."""

    endpoint: str
    port: int


def _last_value(flags: list[str], name: str) -> str | None:
    """The value of the last `name VALUE` or `name=VALUE` among `flags`, as argparse reads them."""
    value = None
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif flag.startswith(name + "="):
            value = flag[len(name) + 1:]
    return value


class Launcher:
    """Starts local services and stops them all at `close()`.

    serve_args: flags put on every `serve` command before the per-call extras (a later flag wins,
    so a call can override them). model: the default `--model` of every worker (None: the worker's
    own default). env: the children's environment (default `child_env()`)."""

    def __init__(self, log_dir: str | Path, *, serve_args: tuple[str, ...] = (), model: str | Path | None = None,
                 env: dict | None = None, cwd: str | Path = ROOT, python: str = sys.executable,
                 ready_timeout_s: float = 60.0):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.serve_args = tuple(serve_args)
        self.model = None if model is None else str(model)
        self.env = child_env() if env is None else env
        self.cwd = cwd
        self.python = python
        self.ready_timeout_s = ready_timeout_s
        self.procs: list[ChildProcess] = []
        self._workers: list[ChildProcess] = []  # the `worker` processes among them
        self._n = 0

    def start(self, cmd: list[str], name: str, cls=ChildProcess) -> ChildProcess:
        """Any other local child (stopped at close() like the rest); its log is `NN-name.log`.

        Started from the main thread, it dies with this process (die_with_parent): a driver killed
        outright, which never reaches close(), left its workers holding the GPU and its scheduler the
        ports of every later run. Not from another thread (a test restarting a scheduler from one): the
        kill signal comes when the forking thread ends, which would take the child with it."""
        self._n += 1
        tied = threading.current_thread() is threading.main_thread()
        proc = cls(cmd, self.log_dir / f"{self._n:02d}-{name}.log", env=self.env, cwd=self.cwd, tied=tied)
        self.procs.append(proc)
        return proc

    def _cli(self, *args: str) -> list[str]:
        return [self.python, "-m", "candidate_scheduler.cli", *args]

    def scheduler(self, *extra: str, compat: bool = False, metrics: bool = False,
                  name: str = "scheduler") -> SchedulerHandle:
        """`serve` on OS-picked ports. compat: start the sglang compat bridge too; metrics: serve
        Prometheus metrics (handle.metrics is the URL). `extra` goes last on the command line."""
        # SIGTERM stops it at once (--stop-grace-s 0), as every release before the graceful stop did, which
        # the tests of shutdown answers expect; a test of the graceful stop passes a grace in `extra`
        cmd = self._cli("serve", "--request-port", "0", "--control-port", "0", "--worker-port", "0",
                        "--metrics-port", "0" if metrics else "-1", "--stop-grace-s", "0", *self.serve_args)
        cmd += ["--compat-port", "0"] if compat else ["--no-compat"]
        proc = self.start(cmd + list(extra), name)
        proc.wait_line(LAST_SERVE_LINE, self.ready_timeout_s)
        found = {m.group(1): m.group(2) for line in proc.lines if (m := ENDPOINT_LINE.search(line))}

        def endpoint(key: str) -> str | None:
            value = found.get(key)
            return None if value in (None, "off") else value

        keys = None
        key_dir = _last_value([*self.serve_args, *extra], "--curve-dir")  # as on the command line: the last wins
        if key_dir is not None:  # the key directory's admin pair (`keys DIR` writes one)
            from candidate_scheduler.service.keys import ClientKeys

            keys = ClientKeys.load(key_dir)
        return SchedulerHandle(proc, found["request endpoint"], found["control endpoint"], found["worker link"],
                               endpoint("metrics"), endpoint("sglang compat"), keys=keys)

    def worker(self, handle, adapter: str = "null", capacity: int | None = 8, *extra: str,
               model: str | Path | None = None, device: str | None = None, step_delay: float | None = None,
               name: str | None = None) -> ChildProcess:
        """A `worker` connected to `handle.worker` (anything with `.worker` and `.workers` will do);
        appended to `handle.workers`. `extra` goes last on the command line."""
        cmd = self._cli("worker", "--scheduler", handle.worker, "--adapter", adapter)
        if capacity is not None:
            cmd += ["--capacity", str(capacity)]
        if step_delay is not None:
            cmd += ["--step-delay", str(step_delay)]
        if device is not None:
            cmd += ["--device", device]
        model = self.model if model is None else str(model)
        if model is not None:
            cmd += ["--model", model]
        proc = self.start(cmd + list(extra), name or f"worker-{adapter}")
        self._workers.append(proc)
        handle.workers.append(proc)
        return proc

    def bridge(self, scheduler_request: str, *extra: str, name: str = "bridge") -> BridgeProcess:
        """A compat bridge on an OS-picked loopback port in front of `scheduler_request`."""
        cmd = [self.python, "-m", "candidate_scheduler.compat.bridge", "--bind", "tcp://127.0.0.1:0",
               "--scheduler", scheduler_request, "--log-level", "INFO", *extra]
        proc = self.start(cmd, name, BridgeProcess)
        proc.endpoint = proc.wait_line(BRIDGE_READY, self.ready_timeout_s).group(1)
        proc.port = int(proc.endpoint.rsplit(":", 1)[1])
        return proc

    def close(self, timeout_s: float = 5.0) -> None:
        """Every worker at once, then the other processes one by one, the latest started first (a
        scheduler outlives its workers, as it did when each was stopped in turn). A child that SIGKILL
        does not end (stuck in a GPU driver) is said after every other one is stopped, not before."""
        stuck: list[subprocess.TimeoutExpired] = []
        try:
            stop_together(self._workers, timeout_s)
        except subprocess.TimeoutExpired as exc:
            stuck.append(exc)
        for proc in reversed(self.procs):
            try:
                proc.stop(timeout_s=timeout_s)
            except subprocess.TimeoutExpired as exc:
                stuck.append(exc)
        if stuck:
            raise stuck[0]

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
