"""The scheduler restarted mid-load (an upgrade): a graceful stop against an immediate one and a crash.

What an upgrade of the scheduler costs the groups in flight. Each run starts a scheduler and K null
workers on fixed ports, and clients that send groups at a steady rate the fleet serves without a
queue, each with `Client.submit(..., resubmit=True)` in its own thread, as a robot fleet does. Two
seconds in, the scheduler is signalled; a supervisor starts the next run on the same ports as soon as
it has exited (what Kubernetes' `Recreate` or systemd's `Restart=always` does), and the workers
register with it by themselves. Arms:

- `graceful`: SIGTERM with `--stop-grace-s 30` (the default is 25): it serves what it admitted, refuses
  the rest `stopping`, then goes;
- `immediate`: SIGTERM with `--stop-grace-s 0`, every release's behaviour before the graceful stop: what is
  in flight is answered `shutting_down`;
- `sigkill`: a crash; the clients find out from their liveness PINGs.

Reported per run, from what each client was answered first (`Result.resent`): the groups the stopping run
had admitted and did not run to the end (`shutting_down`, or, after a crash, no answer: run again from
the start by the next run: work thrown away), the groups it refused while it stopped (`stopping`: they
waited for the next run), the time from the signal to the next run's first answer, each group's time
from its first send to its answer (the client's view), and whether every group was `done` with the
exact candidates.
`python -m candidate_scheduler.bench.scheduler_stop --out DIR`; not part of `make bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import median_range
from candidate_scheduler.bench.worker_leave import IMAGE, expected
from candidate_scheduler.service.launcher import Launcher

ARMS = ("graceful", "immediate", "sigkill")
GRACE = {"graceful": "30", "immediate": "0", "sigkill": "30"}


def run_arm(arm: str, *, workers: int = 2, capacity: int = 4, step_s: float = 0.05, steps: int = 8,
            groups: int = 24, count: int = 4, rate: float = 4.0, signal_at_s: float = 2.1) -> dict:
    with Launcher(tempfile.mkdtemp(prefix=f"cs-stop-{arm}-")) as launcher:
        sched = launcher.scheduler("--stop-grace-s", GRACE[arm])
        for _ in range(workers):
            launcher.worker(sched, "null", capacity, step_delay=step_s)
        sched.wait_workers(workers)
        t0 = time.monotonic()
        sent_at: dict[str, float] = {}
        answered: dict[str, tuple[float, object]] = {}

        def client(i: int) -> None:
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            rid = f"{arm}-{i}"
            sent_at[rid] = time.monotonic()
            with sched.client(timeout_s=120) as c:
                r = c.submit(IMAGE, "pick", count=count, seed=1000 + i, steps=steps, request_id=rid,
                             return_candidates=True, resubmit=True)
            answered[rid] = (time.monotonic(), r)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(groups)]
        for t in threads:
            t.start()
        time.sleep(max(0.0, t0 + signal_at_s - time.monotonic()))
        signalled = time.monotonic()
        os.kill(sched.proc.pid, signal.SIGKILL if arm == "sigkill" else signal.SIGTERM)
        sched.proc.proc.wait(timeout=60)
        stopped = time.monotonic()
        nxt = launcher.scheduler(*sched.same_ports())  # the supervisor: the next run, on the same ports
        with nxt.client() as c:
            c.ping(30)
            serving = time.monotonic()
            nxt.wait_workers(workers, timeout_s=30)
        for t in threads:
            t.join(180)
        with nxt.client() as c:  # which groups the next run ran ("unknown": the stopping run answered them)
            ran_next = {rid for rid in answered if c.status(rid).state != "unknown"}
    before = {rid for rid, t in sent_at.items() if t < signalled}
    replies = {rid: r for rid, (_t, r) in answered.items()}
    first_answer = {rid: (r.resent or [None])[0] for rid, r in replies.items()}
    # a crash answers nothing: what it had admitted is what was sent before it and ran on the next run
    thrown = {rid for rid in ran_next if first_answer[rid] == "shutting_down"
              or (first_answer[rid] == "unavailable" and rid in before)}
    exact = len(replies) == groups and all(
        r.status == "done" and np.array_equal(r.candidates, expected(1000 + int(rid.rsplit("-", 1)[1]), count, steps))
        for rid, r in replies.items())
    waits = {rid: answered[rid][0] - sent_at[rid] for rid in answered}
    return {"arm": arm, "exact": exact, "statuses": sorted({r.status for r in replies.values()}),
            "thrown_away": len(thrown), "refused_stopping": sum(a == "stopping" for a in first_answer.values()),
            "sent_after_signal": len(set(sent_at) - before),
            "stop_s": stopped - signalled, "next_run_answered_s": serving - signalled,
            "slowest_s": max(waits.values()), "median_s": statistics.median(waits.values()),
            "slowest_before_signal_s": max(waits[rid] for rid in before),
            "settings": {"workers": workers, "capacity": capacity, "step_s": step_s, "steps": steps,
                         "groups": groups, "count": count, "rate": rate, "signal_at_s": signal_at_s}}


def report(runs: list[dict]) -> str:
    s = runs[0]["settings"]
    lines = [f"# The scheduler restarted mid-load ({time.strftime('%Y-%m-%d')})", "",
             f"{s['workers']} null workers ({s['capacity']} rows, {s['step_s'] * 1e3:.0f} ms steps); {s['groups']} "
             f"groups of {s['count']} candidates at {s['steps']} steps sent at {s['rate']:g} a second (no queue), each "
             f"by its own `Client.submit(..., resubmit=True)`; {s['signal_at_s']:g} s in the scheduler is signalled "
             "and its next run started on the same ports as soon as it has exited. A group's time is from its "
             "first send to its answer, as its client sees it. Medians over the rounds, ranges in brackets.", "",
             "| arm | admitted, not run to the end (run again) | refused while stopping | signal to exit, s | "
             "signal to the next run's first answer, s | median group s | slowest group sent before the signal, s "
             "| slowest group s | every group done, exact | runs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        if not rs:
            continue

        def cell(key, form="{:.2f}", rs=rs):
            return median_range([r[key] for r in rs], form)

        lines.append(f"| {arm} | {cell('thrown_away', '{:.0f}')} | {cell('refused_stopping', '{:.0f}')} | "
                     f"{cell('stop_s')} | {cell('next_run_answered_s')} | {cell('median_s')} | "
                     f"{cell('slowest_before_signal_s')} | {cell('slowest_s')} | {all(r['exact'] for r in rs)} | "
                     f"{len(rs)} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if any(r["arm"] == a for r in runs)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((axes[0], "thrown_away", "groups admitted and run again by the next run"),
                           (axes[1], "slowest_before_signal_s", "slowest group sent before the signal, s")):
        for x, arm in enumerate(arms):
            vals = [r[key] for r in runs if r["arm"] == arm]
            ax.bar(x, statistics.median(vals), color=("tab:green", "tab:orange", "tab:red")[ARMS.index(arm)])
            ax.plot([x] * len(vals), vals, "k.", ms=6)
        ax.set_xticks(range(len(arms)), arms)
        ax.set_title(title, fontsize=10)
    fig.suptitle("The scheduler restarted mid-load: SIGTERM with a grace, without one, and SIGKILL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=Path("bench/results/scheduler_stop"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(args.rounds):
        for arm in args.arms:  # alternating: the host's drift falls on every arm alike
            runs.append(run_arm(arm))
            r = runs[-1]
            print(f"round {k + 1}/{args.rounds} {arm}: thrown away {r['thrown_away']}, slowest {r['slowest_s']:.2f} s, "
                  f"next run after {r['next_run_answered_s']:.2f} s, exact {r['exact']}", flush=True)
    (args.out / "scheduler_stop.json").write_text(json.dumps(runs, indent=1) + "\n")
    (args.out / "scheduler_stop.md").write_text(report(runs))
    plot(runs, args.out / "scheduler_stop.png")
    print(report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
