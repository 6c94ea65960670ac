"""How much a joiner's conditioning costs the running batch, inline and on the conditioning thread.

The worker starts groups that arrive on its conditioning thread (worker/preparing.py) while the compute
thread keeps stepping the running groups. This measures why, on the Cosmos3 adapter itself:

- alone: the median step of a running batch (two groups of N, not in lockstep), and the median `start` of
  a group with a new observation (its VAE encode and preprocessing), each with nothing beside it;
- beside: for `seconds`, the compute thread steps the batch while a second thread starts new groups back
  to back; counted are the steps and the starts done in that window;
- the gain: what those steps and starts would have taken one after another (alone times), over the
  window. 1.0 means no overlap at all; 2.0 means each ran as fast as alone.

    python -m candidate_scheduler.bench.conditioning_overlap [--model DIR] [--n 4] [--seconds 1.5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import DEFAULT_MODEL, PROMPT
from candidate_scheduler.bench.step_profile import on_compute_thread
from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec


def measure(adapter, n: int = 4, seconds: float = 1.5, side: int = 64) -> dict:
    rng = np.random.default_rng(0)
    made = [0]

    def fresh(count: int, steps: int) -> GroupWork:
        made[0] += 1
        image = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        return GroupWork(f"overlap-{made[0]}", image, [PROMPT], SamplingSpec(height=side, width=side, steps=steps),
                         [CandidateWork(i, seed=1000 * made[0] + i) for i in range(count)])

    def start_alone() -> float:
        t = time.perf_counter()
        adapter.release(adapter.start(fresh(1, 20)))
        return time.perf_counter() - t

    # two step counts, so not in lockstep: each group steps its own solvers, as joiners mostly do
    # (sglang's UniPC fails past ~110 steps on the tiny checkpoint, hence the window's step bound)
    running = [adapter.start(fresh(n, steps)) for steps in (100, 99)]
    started: list = []  # the groups the second thread starts
    try:
        for _ in range(3):
            adapter.step(running)
        steps_alone = []
        for _ in range(20):
            t = time.perf_counter()
            adapter.step(running)
            steps_alone.append(time.perf_counter() - t)
        start_alone()
        starts_alone = [start_alone() for _ in range(5)]
        step_s, start_s = statistics.median(steps_alone), statistics.median(starts_alone)

        stop = threading.Event()

        def conditioning():
            while not stop.is_set():
                # released on the compute thread afterwards, as the worker does (release takes the step lock)
                started.append(adapter.start(fresh(1, 20)))

        side_thread = threading.Thread(target=conditioning, name="conditioning")
        side_thread.start()
        time.sleep(0.2)  # the first start is under way
        first, t0, steps = len(started), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds and running[1].step_index < running[1].steps - 1:
            adapter.step(running)
            steps += 1
        window = time.perf_counter() - t0
        done = len(started) - first
        stop.set()
        side_thread.join()
    finally:
        for g in running + started:
            adapter.release(g)
    one_after_another = steps * step_s + done * start_s
    return {"n": n, "step_alone_ms": 1e3 * step_s, "start_alone_ms": 1e3 * start_s, "window_s": window,
            "steps_beside": steps, "starts_beside": done, "step_beside_ms": 1e3 * window / steps,
            "one_after_another_s": one_after_another, "gain": one_after_another / window}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--n", type=int, default=4, help="candidates in each of the two running groups")
    p.add_argument("--seconds", type=float, default=1.5, help="the window with both threads busy (at most ~75 steps)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter
    from candidate_scheduler.worker.tiny_checkpoint import ensure_checkpoint

    model = ensure_checkpoint(Path(args.model)) if Path(args.model) == DEFAULT_MODEL else args.model
    adapter = on_compute_thread(Cosmos3CandidateAdapter, model)
    for _ in range(args.rounds):
        r = on_compute_thread(measure, adapter, n=args.n, seconds=args.seconds)
        print(f"2 groups x N={r['n']}: step alone {r['step_alone_ms']:.1f} ms, start alone {r['start_alone_ms']:.1f} ms; "
              f"beside each other for {r['window_s']:.2f} s: {r['steps_beside']} steps ({r['step_beside_ms']:.1f} ms "
              f"each) + {r['starts_beside']} starts, {r['one_after_another_s']:.2f} s one after another "
              f"-> {r['gain']:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
