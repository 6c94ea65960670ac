"""A worker replaced mid-load: graceful (SIGTERM) against a crash (SIGKILL).

What a rolling update or a scale-down costs the groups in flight. Each run starts a scheduler (default
flags: 3 s heartbeat timeout) and K null workers, sends groups, and one second in signals
one worker and starts its replacement (a surge, as a Deployment's rolling update does). Two loads: a
`burst` (every group at once: the fleet stays saturated, so what one worker loses is absorbed into
the backlog) and `paced` (groups at a steady rate the fleet serves without a queue, as a robot fleet
sends them: what the signalled worker held shows in those groups' own latency). Arms:

- `none`: no worker is signalled (the replacement still joins: the same fleet size afterwards);
- `sigterm`: the worker leaves gracefully (LEAVING, finishes what it holds, LEFT);
- `sigkill`: the worker dies; the scheduler notices when its heartbeats lapse.

Reported per run: the wall time, the slices run again (`retries` summed over the replies), how
long the scheduler listed the worker after the signal, the worker's exit, and whether every group was
`done` with the exact candidates (the null model's action is a function of its seed). The arms
alternate, `--rounds` times. `python -m candidate_scheduler.bench.worker_leave --out DIR`; not part of
`make bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import median_range
from candidate_scheduler.core import rng
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.client import make_request, synthetic_image
from candidate_scheduler.service.launcher import Launcher
from candidate_scheduler.worker.null_adapter import NullAdapter

ARMS = ("none", "sigterm", "sigkill")
IMAGE = synthetic_image(64, 64, seed=5)
WORKER_LINE = re.compile(r"candidate-scheduler worker (\S+): connecting")  # its first line: its id


def expected(seed: int, count: int, steps: int) -> np.ndarray:
    """The null model's candidates for a group of this seed, count and steps on IMAGE: what exact means."""
    sampling, mean = SamplingSpec(steps=steps), float(IMAGE.astype(np.float64).mean())
    seeds = rng.candidate_seeds(seed, count, "per_candidate")
    return np.stack([NullAdapter.expected(s, mean, sampling) for s in seeds])


LOADS = {"burst": {"groups": 48, "rate": None}, "paced": {"groups": 24, "rate": 6.0}}


def run_arm(arm: str, *, workers: int = 4, capacity: int = 4, step_s: float = 0.05, steps: int = 8,
            groups: int = 48, count: int = 4, signal_at_s: float = 1.0, rate: float | None = None) -> dict:
    with Launcher(tempfile.mkdtemp(prefix=f"cs-leave-{arm}-")) as launcher:
        sched = launcher.scheduler()
        procs = [launcher.worker(sched, "null", capacity, step_delay=step_s) for _ in range(workers)]
        sched.wait_workers(workers)
        with sched.client() as c, sched.client() as watcher:
            target = next(iter(watcher.stats()["workers"]))  # a worker id; which process is it?
            victim = next(p for p in procs if p.wait_line(WORKER_LINE, 5).group(1) == target)
            t0 = time.monotonic()
            requests = [make_request(IMAGE, "pick", count=count, seed=1000 + i, return_candidates=True, steps=steps,
                                     request_id=f"{arm}-{i}") for i in range(groups)]
            rids = [r.request_id for r in requests]
            replies: dict[str, object] = {}

            def send_and_wait() -> None:  # one thread owns the client's socket
                for i, req in enumerate(requests):
                    if rate is not None:
                        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                    c.send(req)
                replies.update({r: c.wait(r, timeout_s=120) for r in rids})

            waiter = threading.Thread(target=send_and_wait)
            waiter.start()
            time.sleep(signal_at_s)
            signalled = time.monotonic()
            if arm != "none":
                os.kill(victim.pid, signal.SIGTERM if arm == "sigterm" else signal.SIGKILL)
            launcher.worker(sched, "null", capacity, step_delay=step_s)  # the replacement
            listed_s = None
            while arm != "none" and listed_s is None and time.monotonic() - signalled < 30:
                stats = watcher.stats()
                if target not in stats["workers"] and target not in stats.get("leaving", {}):
                    listed_s = time.monotonic() - signalled
                time.sleep(0.02)
            waiter.join()
            wall = time.monotonic() - t0
            exit_code = victim.proc.wait(timeout=40) if arm != "none" else None
    exact = all(r.status == "done" and np.array_equal(r.candidates, expected(1000 + i, count, steps))
                for i, r in enumerate(replies[rid] for rid in rids))
    return {"arm": arm, "wall_s": wall, "retries": sum(int(r.metrics["retries"]) for r in replies.values()),
            "statuses": sorted({r.status for r in replies.values()}), "exact": exact,
            "worker_listed_s": listed_s, "worker_exit": exit_code,
            "slowest_s": max(float(r.metrics["total_s"]) for r in replies.values()),
            "median_s": float(np.median([r.metrics["total_s"] for r in replies.values()])),
            "settings": {"workers": workers, "capacity": capacity, "step_s": step_s, "steps": steps,
                         "groups": groups, "count": count, "signal_at_s": signal_at_s, "rate": rate}}


def report(runs: list[dict]) -> str:
    s = runs[0]["settings"]
    lines = [f"# A worker replaced mid-load: graceful against a crash ({time.strftime('%Y-%m-%d')})", "",
             f"{s['workers']} null workers ({s['capacity']} rows, {s['step_s'] * 1e3:.0f} ms steps), groups of "
             f"{s['count']} candidates at {s['steps']} steps; {s['signal_at_s']:.0f} s in, one worker is signalled "
             "and a replacement started. Scheduler defaults (3 s heartbeat timeout). A group's time is the "
             "scheduler's receipt to reply. Medians over the rounds, ranges in brackets.", ""]
    for load in LOADS:
        rows = [r for r in runs if r["load"] == load]
        if not rows:
            continue
        rate = rows[0]["settings"]["rate"]
        lines += [f"## {load}: {rows[0]['settings']['groups']} groups "
                  + ("at once" if rate is None else f"at {rate:g} a second"), "",
                  "| arm | wall s | slices run again | worker listed after the signal, s | median group s | "
                  "slowest group s | every group done, exact | runs |", "|---|---|---|---|---|---|---|---|"]
        for arm in ARMS:
            rs = [r for r in rows if r["arm"] == arm]
            if not rs:
                continue

            def cell(key, form="{:.2f}", rs=rs):
                return median_range([r[key] for r in rs], form)

            lines.append(f"| {arm} | {cell('wall_s')} | {cell('retries', '{:.0f}')} | {cell('worker_listed_s')} | "
                         f"{cell('median_s')} | {cell('slowest_s')} | {all(r['exact'] for r in rs)} | {len(rs)} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(load, key, title) for load in LOADS for key, title in
              (("retries", "slices run again"), ("slowest_s", "slowest group, s"))]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4))
    for ax, (load, key, title) in zip(axes, panels):
        for k, arm in enumerate(ARMS):
            vals = [r[key] for r in runs if r["arm"] == arm and r["load"] == load]
            ax.scatter([k] * len(vals), vals, color=f"C{k}")
            if vals:
                ax.hlines(statistics.median(vals), k - 0.25, k + 0.25, color=f"C{k}")
        ax.set_xticks(range(len(ARMS)), ARMS)
        ax.set_title(f"{load}: {title}", fontsize=10)
        ax.set_ylim(bottom=0)
    fig.suptitle("One worker of four replaced mid-load: SIGTERM (graceful) against SIGKILL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(args.rounds):
        for load, settings in LOADS.items():
            for arm in ARMS:
                runs.append({**run_arm(arm, **settings), "load": load})
                r = runs[-1]
                print(f"round {k + 1}/{args.rounds} {load} {arm}: wall {r['wall_s']:.2f} s, retries {r['retries']}, "
                      f"listed {r['worker_listed_s']}, slowest {r['slowest_s']:.2f} s, exit {r['worker_exit']}, "
                      f"exact {r['exact']}", flush=True)
    (out / "worker_leave.json").write_text(json.dumps(runs, indent=1))
    (out / "worker_leave.md").write_text(report(runs))
    plot(runs, out / "worker_leave.png")
    print(report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
