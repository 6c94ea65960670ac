"""The load benchmark's arms as local processes, each behind a native request endpoint.

- `sglang_sequential`: `python -m candidate_scheduler.bench.sglang_fcfs` (sglang's own pipeline, one
  candidate per request, first come first served). It is started in every run: it is also the parity
  reference for the other arms.
- `dispatch`, `step`: a `serve` process (with the arm's extra flags) and one cosmos3 `worker`;
  `step_inline` (on request): `step` with the worker's `--conditioning inline`.

Every process is started before any is waited for, so the three sglang imports overlap.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from candidate_scheduler.bench.load_plan import DEFAULT_ARM_FLAGS, SERVICE_ARMS, WORKER_CAPACITY, WORKER_FLAGS
from candidate_scheduler.service.launcher import Launcher, SchedulerHandle
from candidate_scheduler.service.processes import ChildProcess

_FCFS_READY = re.compile(r"sglang-fcfs: listening on (\S+)(?: control (\S+))?")
_FLAG_ERRORS = ("unrecognized arguments", "invalid choice", "expected one argument")


@dataclass
class Arm:
    name: str
    endpoint: str = ""
    control: str = ""  # where CANCEL goes ("": nowhere, the arm's groups are waited for)
    flags: tuple[str, ...] = ()
    handle: SchedulerHandle | None = None
    proc: ChildProcess | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def metrics_url(self) -> str | None:
        return None if self.handle is None else self.handle.metrics

    def cancel(self, request_ids: list[str]) -> None:
        """Ask the arm to stop these groups (a load point whose verdict is known); each is answered
        `cancelled`, or as it ends if it was about to."""
        from candidate_scheduler.service.client import Client

        with Client(self.endpoint, self.control, timeout_s=10.0) as client:
            for rid in request_ids:
                client.cancel(rid)

    def pids(self) -> list[int]:
        if self.handle is not None:
            return [self.handle.proc.pid] + [w.pid for w in self.handle.workers]
        return [] if self.proc is None else [self.proc.pid]


def _rejected_flags(log_path) -> bool:
    """Did `serve` exit at argument parsing (a flag this version does not have)?"""
    try:
        text = open(log_path).read()
    except OSError:
        return False
    return any(e in text for e in _FLAG_ERRORS)


def _start_service(launcher: Launcher, name: str, flags: tuple[str, ...], model: str, device: str,
                   worker_flags: tuple[str, ...] = ()) -> Arm:
    arm = Arm(name, flags=flags)
    try:
        arm.handle = launcher.scheduler(*flags, metrics=True, name=f"{name}-scheduler")
    except RuntimeError:
        log_path = launcher.procs[-1].log_path
        if not _rejected_flags(log_path):
            raise
        if name == "dispatch" and flags == DEFAULT_ARM_FLAGS["dispatch"]:
            # Before `--batching` exists, serve's only batching is dispatch batching.
            arm.flags = ()
            arm.notes.append(f"`serve` does not accept `{' '.join(flags)}`: ran `serve` with no batching flag "
                             "(its only batching is dispatch batching)")
            arm.handle = launcher.scheduler(metrics=True, name=f"{name}-scheduler")
        else:
            arm.notes.append(f"skipped: `serve` does not accept `{' '.join(flags)}` (log {log_path})")
            return arm
    arm.endpoint, arm.control = arm.handle.request, arm.handle.control
    launcher.worker(arm.handle, "cosmos3", WORKER_CAPACITY, *worker_flags, *WORKER_FLAGS.get(name, ()), model=model,
                    device=device, name=f"{name}-worker")
    return arm


def start_arms(launcher: Launcher, names: list[str], flags: dict[str, tuple[str, ...]], model: str,
               device: str, ready_timeout_s: float = 300.0,
               sides: tuple[int, ...] = ()) -> tuple[dict[str, Arm], dict[str, list[str]], Arm]:
    """Start the arms; returns (the arms that run, {skipped arm: notes}, the sglang reference arm). The
    workers warm up at every shape of the run (`sides`), so each shape's cost model is its own measure."""
    worker_flags = ("--warmup-shapes", ",".join(f"{s}x{s}" for s in sides)) if sides else ()
    fcfs = launcher.start([sys.executable, "-m", "candidate_scheduler.bench.sglang_fcfs", "--model", model,
                           "--device", device], "sglang-fcfs")
    reference = Arm("sglang_sequential", proc=fcfs)
    arms: dict[str, Arm] = {}
    skipped: dict[str, list[str]] = {}
    for name in names:
        if name in SERVICE_ARMS:
            arm = _start_service(launcher, name, flags[name], model, device, worker_flags)
            if arm.handle is None:
                skipped[name] = arm.notes
            else:
                arms[name] = arm
    ready = fcfs.wait_line(_FCFS_READY, ready_timeout_s)
    reference.endpoint, reference.control = ready.group(1), ready.group(2) or ""
    if "sglang_sequential" in names:
        arms["sglang_sequential"] = reference
    for arm in arms.values():
        if arm.handle is not None:
            arm.handle.wait_workers(1, timeout_s=ready_timeout_s, poll_s=0.2)
    return {n: arms[n] for n in names if n in arms}, skipped, reference


def rows_per_forward(before: dict[str, float], after: dict[str, float]) -> tuple[float | None, str | None]:
    """Rows per transformer forward over one load point, from `bench.scrape.scrape` deltas: the workers' per-forward
    rows (`forward_rows`) when the scheduler has them; else the rows per physical batch (`batch_rows`),
    which is rows per forward when every batch runs all its steps together (dispatch batching)."""
    for key, source in (("forward_rows", "forward_rows histogram"), ("batch_rows", "batch_rows histogram")):
        sums = [n for n in after if key in n and n.endswith("_sum")]
        for name in sums:
            count = name[: -len("_sum")] + "_count"
            d_sum = after[name] - before.get(name, 0.0)
            d_count = after.get(count, 0.0) - before.get(count, 0.0)
            if d_count > 0:
                return d_sum / d_count, source
    return None, None
