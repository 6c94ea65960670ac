"""Shared fixtures: real scheduler and worker processes on real sockets.

Processes are started with `python -m candidate_scheduler.cli ...` and every port is picked by the
OS (port 0), read back from the endpoint lines `serve` prints. Everything started by a test is
killed at teardown, even when the test fails.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from candidate_scheduler.service.processes import ChildProcess

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / ".cache" / "tiny-cosmos3"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", SGLANG_DISABLE_COSMOS3_GUARDRAILS="1", PYTHONUNBUFFERED="1")

_LINE = re.compile(r"candidate-scheduler: (request endpoint|control endpoint|worker link|metrics|sglang compat)\s+(\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll a condition of another process (a status, a registration) until it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Proc(ChildProcess):
    """A child process of a test, with the test environment, run from the repository root."""

    def __init__(self, cmd: list[str], log_path: Path):
        super().__init__(cmd, log_path, env=ENV, cwd=ROOT)


@dataclass
class SchedulerHandle:
    proc: Proc
    request: str
    control: str
    worker: str
    metrics: str
    compat: str
    workers: list[Proc] = field(default_factory=list)

    def client(self, **kw):
        from candidate_scheduler.service.client import Client

        return Client(self.request, self.control, **kw)

    def wait_workers(self, n: int, timeout_s: float = 120.0) -> dict:
        with self.client() as c:
            def enough():
                stats = c.stats()
                return stats if len(stats["workers"]) >= n else None

            return wait_for(enough, timeout_s, f"{n} worker(s)")


class Services:
    """Factory for scheduler/worker processes; tears everything down at the end of the test."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []
        self._n = 0

    def _log(self, name: str) -> Path:
        self._n += 1
        return self.tmp_path / f"{self._n:02d}-{name}.log"

    def scheduler(self, *extra: str, compat: bool = False, metrics: bool = False) -> SchedulerHandle:
        cmd = [sys.executable, "-m", "candidate_scheduler.cli", "serve", "--request-port", "0", "--control-port", "0",
               "--worker-port", "0", "--metrics-port", "0" if metrics else "-1",
               "--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5"]
        if compat:
            cmd += ["--compat-port", "0"]
        else:
            cmd.append("--no-compat")
        proc = Proc(cmd + list(extra), self._log("scheduler"))
        self.procs.append(proc)
        proc.wait_line(re.compile(r"candidate-scheduler: sglang compat"), 60)  # printed last
        found = {m.group(1): m.group(2) for line in proc.lines if (m := _LINE.search(line))}
        return SchedulerHandle(proc, found["request endpoint"], found["control endpoint"], found["worker link"],
                               found["metrics"], found["sglang compat"])

    def worker(self, handle: SchedulerHandle, adapter: str = "null", capacity: int = 8, step_delay: float = 0.0,
               *extra: str) -> Proc:
        cmd = [sys.executable, "-m", "candidate_scheduler.cli", "worker", "--scheduler", handle.worker,
               "--adapter", adapter, "--capacity", str(capacity), "--step-delay", str(step_delay),
               "--model", str(MODEL_DIR), *extra]
        proc = Proc(cmd, self._log(f"worker-{adapter}"))
        self.procs.append(proc)
        handle.workers.append(proc)
        return proc

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop(timeout_s=5)


@pytest.fixture
def services(tmp_path):
    s = Services(tmp_path)
    yield s
    s.close()


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from candidate_scheduler.worker.tiny_checkpoint import ensure_checkpoint

    return ensure_checkpoint(MODEL_DIR)


@pytest.fixture(scope="session")
def sglang_reference(model_dir):
    """sglang's own Cosmos3Pipeline in this process (one ~15 s import per test session):
    reference(image, prompt, sampling: SamplingSpec | dict, seed) -> float32 [horizon, raw_dim]."""
    from candidate_scheduler.core.work import SamplingSpec
    from candidate_scheduler.worker.cosmos3 import load_sglang_pipeline, sglang_reference_actions

    pipeline, server_args = load_sglang_pipeline(model_dir)

    def reference(image, prompt, sampling, seed):
        if isinstance(sampling, dict):
            sampling = SamplingSpec.from_dict(sampling)
        return sglang_reference_actions(pipeline, server_args, image, prompt, sampling, seed)

    return reference


@dataclass
class Service:
    request_endpoint: str
    control_endpoint: str
    compat_endpoint: str
    metrics_url: str
    model_dir: Path
    reference: object
    handle: SchedulerHandle


@pytest.fixture(scope="session")
def service(tmp_path_factory, model_dir, sglang_reference):
    """One scheduler (with the sglang compat bridge and metrics) and one Cosmos3 worker of capacity 8,
    shared by the tests that only need a working service."""
    services = Services(tmp_path_factory.mktemp("service"))
    try:
        handle = services.scheduler(compat=True, metrics=True)
        services.worker(handle, "cosmos3", 8)
        handle.wait_workers(1, timeout_s=180)
        yield Service(handle.request, handle.control, handle.compat, handle.metrics, model_dir, sglang_reference, handle)
    finally:
        services.close()
