"""Should refusal at receipt watch the RUNNING deadline groups a step-batching joiner would slow? The
deadline benchmark's simulated worker (bench/deadline_sim.py: the real engine, one worker of 8 rows,
`stepping` = discrete steps, `fluid` = exactly as the forecast models it), groups of 4 candidates served
in full or refused, 10 steps, deadlines taken in turn from a mix, 60 s of Poisson arrivals at 3-5
groups/s, two seeds a point. Arm `watch`: core/deadlines._promised as first written, which also watched
the running groups under step batching; arm `queued` (committed): only the groups queued behind.

    PYTHONPATH=. python bench/results/deadline_mix/step_watch/step_watch.py > step_watch.txt
"""

from __future__ import annotations

import collections

import candidate_scheduler.bench.deadline_sim as ds
import candidate_scheduler.core.deadlines as d
from candidate_scheduler.bench.open_loop import poisson_schedule

SAMPLING = {"height": 64, "width": 64, "steps": 10}
STEP_S = {1: 0.011, 4: 0.02, 8: 0.03}
MIXES = ((0.5, 2.0), (0.4, 1.0, 3.0))
QUEUED = d._promised


def watching_running(snap, view):
    """The first version: the queued groups behind, and under step batching the running ones too."""
    found = {g.request_id: g for g in QUEUED(snap, view)}
    if snap.batching == "step":
        for rid in {k[0] for w in snap.workers for a in w.running for k in a.keys}:
            if rid not in found and (g := snap.group(rid)) is not None and g.deadline is not None:
                found[rid] = g
    return [g for g in found.values() if g.request_id != view.request_id]


def simulate_mix(worker: str) -> collections.Counter:
    total = collections.Counter()
    for mix in MIXES:
        for rate in (3.0, 4.0, 5.0):
            for seed in (1, 2):
                arrivals = poisson_schedule(rate, 60.0, seed)
                run = ds.simulate(arrivals, 4, 1.0, STEP_S, SAMPLING, count=4, worker=worker, deadlines=mix)
                for i, o in enumerate(run["outcomes"]):
                    total["groups"] += 1
                    if o["status"] == "done" and o["latency_s"] <= mix[i % len(mix)] + 1e-9:
                        total["in time"] += 1
                    elif o["status"] == "done":
                        total["done late"] += 1
                    else:
                        total[o["error_code"] or o["status"]] += 1
    return total


def main() -> None:
    print("| simulated worker | arm | groups | in time | refused at receipt | expired | done late |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for worker in ("stepping", "fluid"):
        for arm, promised in (("watch", watching_running), ("queued", QUEUED)):
            d._promised = promised
            t = simulate_mix(worker)
            print(f"| {worker} | {arm} | {t['groups']} | {t['in time']} | {t['deadline_unmeetable']} | "
                  f"{t['deadline_exceeded']} | {t['done late']} |")
    d._promised = QUEUED


if __name__ == "__main__":
    main()
