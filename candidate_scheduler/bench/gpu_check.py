"""`make gpu-check` (`python -m candidate_scheduler.bench.gpu_check`): the first GPU figures, in one short
run on a lent CUDA machine, under a time budget (issue 24).

The full-size checkpoint (`make-checkpoint --preset full`, random bf16 weights, fixed seed) is written
by parallel generator threads while the first phases run, to /dev/shm when it has room (sglang's loader
reads a model directory, so the weights go through files; shared memory keeps them off the disk). Each
phase (gpu_phases.py) runs in a child process with its own time cap, so that a phase that fails or
overruns costs only itself and whatever finished is written: env, ceiling (gpu_ceiling.py),
cuda_imports (the rehearsal only: gpu_rehearsal.py), probe (the tiny checkpoint on the
device, twice at once: with sglang's shipped kernels and with its own PyTorch-native ops; every later
phase uses native ops where they ran, which the report says), equivalence, methods, load, fleet.
Writes bench_cuda.json and report_cuda.md (and the fleet benchmark's own files).

`--dry-run` runs every phase on the CPU with the tiny checkpoint at 64x64 (no figures): the proof,
in `make test`, that the script is whole before any device time is spent.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from candidate_scheduler.bench.common import DEFAULT_MODEL, git_rev, json_default
from candidate_scheduler.bench.gpu_report import write_outputs
from candidate_scheduler.service.launcher import child_env
from candidate_scheduler.worker.cosmos3_sglang import OPS_ENV

FULL_SHAPE = {"height": 480, "width": 832, "steps": 35}
FULL_NS = (1, 2, 4, 8, 10)
DRY_SHAPE = {"height": 64, "width": 64, "steps": 4}
DRY_NS = (1, 2)
SHM = Path("/dev/shm")
GRACE_S = 30.0  # how long the shipped-kernel probe may go on once the checkpoint is ready
FULL_CHECKPOINT_GIB = 32  # what the full preset writes (29 GB transformer, 1.4 GB VAE), with room


def settings_for(dry_run: bool, work: Path, model: str | None) -> dict:
    tiny = str(DEFAULT_MODEL)
    return {
        "dry_run": dry_run,
        "device": "cpu" if dry_run else "cuda",
        "tiny_model": tiny,
        "model": tiny if dry_run else (model or str(_full_dir(work))),
        "probe_shape": DRY_SHAPE,
        "shape": DRY_SHAPE if dry_run else FULL_SHAPE,
        "ns": list(DRY_NS if dry_run else FULL_NS),
        "cfg_guidance": 2.0,
        # the worker's default on CUDA (one candidate a transformer call, text rows keyed by their request
        # call); the dry run rehearses both on the CPU, where the worker's own defaults would batch the
        # candidates and share text rows by content, so that the CUDA paths and the passes beside them
        # run there too. (d)'s worker process rehearses the calls only: its text keying follows its device
        "call_rows": 1 if dry_run else "auto",
        "rehearse_cuda_text": dry_run,
        "equivalence_n": 2 if dry_run else 4,
        "equivalence_steps": 4 if dry_run else 10,
        "profile_ns": [1, 2] if dry_run else [1, 8],
        "warmup_steps": 2,
        "load_shape": {"height": 64, "width": 64, "steps": 4} if dry_run else {"height": 256, "width": 256, "steps": 20},
        "load_groups": 4 if dry_run else 16,
        "load_count": 2 if dry_run else 8,
        "reserve_s": 5.0,
    }


def _full_dir(work: Path) -> Path:
    try:
        if shutil.disk_usage(SHM).free > FULL_CHECKPOINT_GIB * 2**30:
            return SHM / "cs-gpu-check-full"
    except OSError:
        pass
    return work / "full-checkpoint"


def start_capped(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    """cmd in a session of its own (so that it can be killed with every process it starts), its
    output to log."""
    with open(log, "w") as f:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_capped(proc: subprocess.Popen, cap_s: float) -> int | str:
    """Its exit status, or "timeout": at cap_s it is killed with every process it started (a phase's
    scheduler and workers too)."""
    try:
        return proc.wait(timeout=max(0.0, cap_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"


def run_capped(cmd: list[str], log: Path, cap_s: float, env: dict) -> int | str:
    return wait_capped(start_capped(cmd, log, env), cap_s)


class GpuCheck:
    """The phases of one gpu-check: each a child process with a cap; what it returned or why not."""

    def __init__(self, out: Path, work: Path, budget_s: float, settings: dict):
        self.out, self.work, self.settings = out, work, settings
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s
        self.env = child_env()
        self.phases: dict[str, dict] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, text: str) -> None:
        print(f"gpu-check [{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    def spawn(self, name: str, cap_s: float, key: str | None = None, env: dict | None = None) -> dict:
        """Start a phase; collect() waits for it. Two may run at once (the two probes)."""
        key = key or name
        cap_s = max(1.0, min(cap_s, self.left()))
        settings = {**self.settings, "phase_budget_s": cap_s}
        sfile, rfile, log = (self.work / f"{key}.settings.json", self.work / f"{key}.result.json",
                             self.work / f"{key}.log")
        sfile.write_text(json.dumps(settings))
        rfile.unlink(missing_ok=True)
        rfile.with_suffix(".partial.json").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "candidate_scheduler.bench.gpu_check", "--phase", name,
               "--settings", str(sfile), "--result", str(rfile)]
        self.say(f"{key}: start (cap {cap_s:.0f} s)")
        return {"key": key, "cap_s": cap_s, "t": time.monotonic(), "t_wall": time.time(), "rfile": rfile,
                "log": log, "proc": start_capped(cmd, log, env or self.env)}

    def collect(self, running: dict) -> dict:
        """Wait for a phase (until its cap) and record it. Its time is its own, also when it is collected
        late (the shipped probe, after the checkpoint): until its result, or its log's last line, was
        written. A phase that wrote a partial result before it failed keeps that, marked partial."""
        key, rfile, log = running["key"], running["rfile"], running["log"]
        rc = wait_capped(running["proc"], running["cap_s"] - (time.monotonic() - running["t"]))
        partial = rfile.with_suffix(".partial.json")
        wall = time.monotonic() - running["t"]
        if rc != "timeout":
            last = next((f.stat().st_mtime for f in (rfile, log) if f.exists()), None)
            wall = min(wall, max(0.0, last - running["t_wall"])) if last is not None else wall
        record = {"wall_s": round(wall, 1), "cap_s": round(running["cap_s"], 1), "rc": rc}
        if rc == 0 and rfile.exists():
            record["result"] = json.loads(rfile.read_text())
        else:
            record["log_tail"] = log.read_text(errors="replace").splitlines()[-30:]
            if partial.exists():
                record.update(result=json.loads(partial.read_text()), partial=True)
        self.phases[key] = record
        outcome = "ok" if rc == 0 and "result" in record else f"{'PARTIAL' if 'result' in record else 'FAILED'} ({rc})"
        self.say(f"{key}: {outcome} in {record['wall_s']} s")
        if "log_tail" in record:
            print("\n".join("    " + line for line in record["log_tail"]), flush=True)
        return record

    def kill(self, running: dict) -> None:
        """A phase started and never collected (the orchestration raised): it must not outlive the run."""
        if running["proc"].poll() is None:
            os.killpg(running["proc"].pid, signal.SIGKILL)
            running["proc"].wait()

    def phase(self, name: str, cap_s: float, key: str | None = None, env: dict | None = None) -> dict:
        return self.collect(self.spawn(name, cap_s, key, env))


def _start_checkpoint(run: GpuCheck) -> subprocess.Popen | None:
    model = Path(run.settings["model"])
    if run.settings["dry_run"] or (model / "tiny_checkpoint.json").exists():
        return None
    run.say(f"full checkpoint: writing to {model} in the background")
    return start_capped([sys.executable, "-m", "candidate_scheduler.cli", "make-checkpoint", str(model),
                         "--preset", "full"], run.work / "checkpoint.log", run.env)


def _wait_checkpoint(run: GpuCheck, proc: subprocess.Popen | None, started: float, cap_s: float) -> dict:
    if proc is None:
        return {"written_by": "already there" if not run.settings["dry_run"] else "tiny (dry run)"}
    rc = wait_capped(proc, max(1.0, cap_s))
    model = Path(run.settings["model"])
    size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file()) if model.exists() else 0
    record = {"rc": rc, "wall_s": round(time.monotonic() - started, 1), "dir": str(model), "bytes": size,
              "written_by": "make-checkpoint --preset full (parallel generator threads, one writer)",
              "log_tail": (run.work / "checkpoint.log").read_text(errors="replace").splitlines()[-5:]}
    run.say(f"full checkpoint: rc {rc}, {size / 2**30:.1f} GiB in {record['wall_s']} s")
    return record


def _fleet(run: GpuCheck, cap_s: float) -> dict:
    """The fleet benchmark (CPU only: the scheduler and null workers) on this machine's cores."""
    smoke = run.settings["dry_run"] or cap_s < 200
    dest = run.work / "fleet"
    cmd = [sys.executable, "-m", "candidate_scheduler.bench", "--fleet", "--no-plots", "--out", str(dest)]
    cmd += ["--smoke"] if smoke else []
    run.say(f"fleet: start ({'smoke' if smoke else 'full'}, cap {cap_s:.0f} s)")
    t = time.monotonic()
    rc = run_capped(cmd, run.work / "fleet.log", max(1.0, cap_s), run.env)
    found = sorted(dest.rglob("fleet*.json"))
    record = {"rc": rc, "smoke": smoke, "wall_s": round(time.monotonic() - t, 1)}
    if rc == 0 and found:
        record["result"] = json.loads(found[0].read_text())
        for report in dest.rglob("fleet*report*.md"):
            shutil.copy(report, run.out / "fleet_cuda.md")
    else:
        record["log_tail"] = (run.work / "fleet.log").read_text(errors="replace").splitlines()[-20:]
    run.say(f"fleet: rc {rc} in {record['wall_s']} s")
    return record


def orchestrate(args) -> int:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    settings = settings_for(args.dry_run, work, args.model)
    run = GpuCheck(out, work, args.budget_s, settings)
    started = time.monotonic()
    writer = _start_checkpoint(run)
    run.phase("env", 60)
    run.phase("ceiling", 90)
    if args.dry_run:
        run.phase("cuda_imports", 120)
    # Both probes at once, on the tiny checkpoint: sglang's shipped kernels (JIT-built on first use,
    # which can take minutes) and its PyTorch-native ops. The measured phases use native ops where
    # they run, so that no kernel build lands inside a timed phase and the check fits its budget;
    # the shipped probe says whether those kernels build and run here, and how long that took. It
    # may go on while the checkpoint is written, and no longer (GRACE_S after).
    shipped_run = run.spawn("probe", 240, key="probe_shipped")
    try:
        native = run.phase("probe", 150, key="probe_native", env={**run.env, OPS_ENV: "native"})
        checkpoint = _wait_checkpoint(run, writer, started, run.left() - 240)
        shipped = run.collect({**shipped_run, "cap_s": min(shipped_run["cap_s"],
                                                           time.monotonic() - shipped_run["t"] + GRACE_S)})
    finally:
        run.kill(shipped_run)
    ops = "native" if "result" in native else "shipped" if "result" in shipped else "none"
    probe = native if ops == "native" else shipped
    if ops == "native":
        run.env[OPS_ENV] = "native"
    usable = "result" in probe and checkpoint.get("rc", 0) in (0, None)
    if usable:
        run.phase("equivalence", min(150, run.left() - 170))
        fleet_reserve = (40 if args.dry_run else 60) if args.fleet else 5
        load_reserve = 60 if args.dry_run else 170
        run.phase("methods", run.left() - fleet_reserve - load_reserve)
        run.phase("load", run.left() - fleet_reserve)
    fleet = _fleet(run, run.left() - 10) if args.fleet else {"skipped": "--no-fleet"}
    result = {"meta": {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                       "git": git_rev(), "dry_run": args.dry_run, "budget_s": args.budget_s, "ops": ops,
                       "wall_s": round(time.monotonic() - run.t0, 1), "settings": settings},
              "checkpoint": checkpoint, "phases": run.phases, "fleet": fleet}
    files = write_outputs(result, out)
    run.say(f"wrote {', '.join(str(f) for f in files)}")
    failed = [k for k, v in run.phases.items() if "result" not in v and not k.startswith("probe")]
    return 1 if failed or ops == "none" else 0


def run_child(args) -> int:
    from candidate_scheduler.bench.gpu_phases import PHASES

    settings = json.loads(Path(args.settings).read_text())
    # where a phase may leave what it has before a riskier part (collect() keeps it if that part fails)
    settings["partial_result"] = str(Path(args.result).with_suffix(".partial.json"))
    result = PHASES[args.phase](settings)
    Path(args.result).write_text(json.dumps(result, default=json_default))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results", help="where bench_cuda.json and report_cuda.md go")
    p.add_argument("--work", default="/tmp/cs-gpu-check", help="phase logs and the full checkpoint (unless /dev/shm)")
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole run's time, set-up excluded (default 540)")
    p.add_argument("--dry-run", action="store_true", help="every phase on the CPU, tiny checkpoint, 64x64: no figures")
    p.add_argument("--model", default=None, help="a full-size checkpoint already written (default: write one)")
    p.add_argument("--no-fleet", dest="fleet", action="store_false", help="skip the fleet benchmark")
    p.add_argument("--phase", choices=["env", "ceiling", "cuda_imports", "probe", "equivalence", "methods", "load"], help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_child(args) if args.phase else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
