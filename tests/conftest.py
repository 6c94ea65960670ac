"""Shared fixtures: real scheduler and worker processes on real sockets.

Processes are started with `python -m candidate_scheduler.cli ...` and every port is picked by the
OS (port 0), read back from the endpoint lines `serve` prints. Everything started by a test is
killed at teardown, even when the test fails.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from candidate_scheduler.service.launcher import Launcher, SchedulerHandle, child_env
from candidate_scheduler.service.processes import ChildProcess

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / ".cache" / "tiny-cosmos3"
ENV = child_env()
# Fast failure detection for the tests that stop or kill workers (a test's own flags come later and win).
TEST_SERVE_ARGS = ("--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5")


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


def hold_the_worker(client, image, prompt, steps: int, timeout_s: float = 20) -> tuple[str, str]:
    """Keep a worker of the default prefetch (1) busy so that groups sent next queue at the scheduler
    and go out together: a blocker it runs, then a filler it holds to start next (different steps:
    neither batches with what follows). Without the filler the first group sent next would be held
    alone, and the co-batching a test wants to see would depend on timing."""
    from candidate_scheduler.service.client import make_request

    blocker = client.send(make_request(image, prompt, count=1, seed=1, steps=steps))
    wait_for(lambda: client.status(blocker).state == "running", timeout_s, "the blocker to run")
    filler = client.send(make_request(image, prompt, count=1, seed=2, steps=steps))
    wait_for(lambda: client.status(filler).state == "running", timeout_s, "the worker to hold the filler")
    return blocker, filler


class Proc(ChildProcess):
    """A child process of a test, with the test environment, run from the repository root."""

    def __init__(self, cmd: list[str], log_path: Path):
        super().__init__(cmd, log_path, env=ENV, cwd=ROOT)


class Services(Launcher):
    """The launcher with the tests' defaults: short heartbeats, the tiny checkpoint for every worker,
    logs in the test's tmp_path; `worker(handle, adapter, capacity, step_delay, *extra)`."""

    def __init__(self, tmp_path: Path):
        super().__init__(tmp_path, serve_args=TEST_SERVE_ARGS, model=MODEL_DIR, env=ENV)
        self.tmp_path = tmp_path

    def worker(self, handle, adapter: str = "null", capacity: int = 8, step_delay: float = 0.0, *extra: str):
        return super().worker(handle, adapter, capacity, *extra, step_delay=step_delay)


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
