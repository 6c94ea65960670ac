"""The engine alone, in process, against queue depth: the scheduler's own cost per event, no IO.

K fake workers (no model, no sockets) answer their assignments oldest first; the queue is held at a
fixed depth by submitting one new group for every group answered, so each measured event sees the
same backlog. What is timed:

- `event_ms`: one `Engine.worker_result` call -- fold the result, reduce, answer, plan the next work;
- `submit_us`: one `Engine.submit` call (validation, admission, planning), per group;
- `groups_per_s`: groups through submit, plan, result and reply, over the timed calls only.

The workers register with a warm-up profile, as real ones do, so the cost model is calibrated and the
deadline code (refusal at receipt, backfill in step mode) runs as it does in production. Each point's
process sets the garbage collector as the scheduler's process does (`gc_tuning.tune_gc`; until
2026-12-03 the points ran at Python's defaults: bench/README, "The engine against the fleet's size").
"""

from __future__ import annotations

import collections
import importlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from candidate_scheduler.bench.common import summary_stats
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import Registration, SendWork, SliceOutcome, WorkerResult
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.spec import ModelCapability

IMAGE = np.full((16, 16, 3), 7, dtype=np.uint8)
HORIZON, ACTION_DIM = 16, 7
LABEL = "64x64h16f5"  # SamplingSpec().forward_label(): what the profile below calibrates


def _capability(rows: int) -> dict:
    return ModelCapability("fake", reducers=("mean", "median", "medoid"), max_candidates_per_batch=rows,
                           max_candidates_per_group=256).to_dict()


class FakeFleet:
    """An engine and K fake workers; every message the engine sends is kept or answered."""

    def __init__(self, batching: str, workers: int, rows: int, *, step_s: float = 0.01, steps: int = 4,
                 deadline_every: int = 0, deadline_s: float = 30.0, counts: tuple[int, ...] = (1,),
                 min_count: int | None = None):
        config = {"batching": batching, "max_queued_groups": 1_000_000}
        # Prefetched work is sent at once and idle workers start at once: late prefetch and staggered
        # starts are timed by the shell's wake-up passes (Engine.wake_at), and this harness has no shell and
        # no real time, only one result after another (bench/fleet_sim.py keeps a clock). (An older engine,
        # measured as the baseline, has neither knob and does both anyway.)
        if "prefetch_lead_s" in EngineConfig.__dataclass_fields__:
            config["prefetch_lead_s"] = math.inf
        if "stagger" in EngineConfig.__dataclass_fields__:
            config["stagger"] = False
        self.engine = Engine(EngineConfig(**config))
        self.now = 1000.0
        self.steps, self.counts = steps, counts
        self.deadline_every, self.deadline_s = deadline_every, deadline_s
        self.min_count = min_count  # with a deadline, an elastic count: [min_count, count]
        self.outstanding: collections.OrderedDict[int, SendWork] = collections.OrderedDict()
        self.answered = 0
        self._n = 0
        profile = tuple((LABEL, r, step_s * (0.5 + 0.5 * r / rows)) for r in (1, rows // 2 or 1, rows))
        for w in range(workers):
            wid = f"w{w}"
            self.take(self.engine.register(wid.encode(), Registration(wid, _capability(rows), rows, profile=profile),
                                           self.now))
        self._actions = {c: np.zeros((c, 1, HORIZON, ACTION_DIM), np.float32) for c in range(1, 257)}

    def take(self, out: list) -> None:
        """Keep what the engine sent: assignments until they are answered, and count the replies."""
        for m in out:
            if isinstance(m, SendWork):
                self.outstanding[m.batch_id] = m
            elif type(m).__name__ == "Reply":
                self.answered += 1

    def submission(self) -> Submission:
        i = self._n
        self._n += 1
        deadline = self.deadline_s if self.deadline_every and i % self.deadline_every == 0 else None
        count = self.counts[i % len(self.counts)]
        candidates = {"count": count, "reducer": "mean"}
        if deadline is not None and self.min_count is not None and self.min_count < count:
            candidates["min_count"] = self.min_count
        return Submission(f"g{i}", IMAGE, "pick", candidates, i, {"steps": self.steps}, deadline_s=deadline)

    def submit(self, n: int, plan: bool = True) -> float:
        """Submit n groups (each followed by a planning pass, or none with `plan` False, as the shell does
        within a burst); the seconds the engine spent."""
        spent = 0.0
        for _ in range(n):
            sub = self.submission()
            t0 = time.perf_counter()
            out = self.engine.submit(("client", sub.request_id), sub, self.now, plan=plan)
            spent += time.perf_counter() - t0
            self.take(out)
        return spent

    def plan(self) -> None:
        self.take(self.engine.plan(self.now))

    def result_of(self, send: SendWork) -> WorkerResult:
        outputs = tuple(SliceOutcome(sw.dispatch.request_id, "ok", sw.dispatch.candidate_ids,
                                     self._actions[len(sw.dispatch.candidate_ids)]) for sw in send.slices)
        return WorkerResult(send.identity.decode(), send.batch_id, outputs, {"transformer_forwards": self.steps})

    def answer_oldest(self) -> float | None:
        """Answer the oldest outstanding assignment; the seconds the engine spent (None: nothing out)."""
        if not self.outstanding:
            return None
        _bid, send = self.outstanding.popitem(last=False)
        result = self.result_of(send)
        self.now += 0.001
        t0 = time.perf_counter()
        out = self.engine.worker_result(send.identity, result, self.now)
        spent = time.perf_counter() - t0
        self.take(out)
        return spent


def time_per_event(batching: str, depth: int, *, workers: int = 32, rows: int = 8, events: int = 400,
                   warmup: int = 50, deadline_every: int = 0, counts: tuple[int, ...] = (1,),
                   min_count: int | None = None, burst_fill: bool = False) -> dict:
    """The engine's time per worker-result event with `depth` groups queued (see the module docstring).
    `burst_fill`: the first groups submitted as one burst and planned once (the fleet-size sweep, where
    a large idle fleet would otherwise spend every measured event on its first one-group assignments)."""
    fleet = FakeFleet(batching, workers, rows, deadline_every=deadline_every, counts=counts, min_count=min_count)
    # the workers' rows full (and what they may hold besides: prefetch), `depth` groups waiting behind them
    held = workers * rows * (1 + getattr(fleet.engine.config, "prefetch", 0)) * len(counts) // sum(counts)
    if burst_fill:  # read as one burst and planned once, as the shell does: full batches from the first
        fleet.submit(depth + held, plan=False)
        fleet.plan()
    else:  # planned after each: an idle fleet's first K assignments carry one group each
        fleet.submit(depth + held)
    event_s: list[float] = []
    submit_s = 0.0
    submitted = 0
    groups_before = fleet.answered
    for i in range(warmup + events):
        before = fleet.answered
        spent = fleet.answer_oldest()
        if spent is None:
            break
        replies = fleet.answered - before
        refill = fleet.submit(replies)
        if i >= warmup:
            event_s.append(spent)
            submit_s += refill
            submitted += replies
        else:
            groups_before = fleet.answered
    done = fleet.answered - groups_before
    queued = fleet.engine.queued_groups()
    ev = summary_stats(event_s)
    return {
        "batching": batching, "depth": depth, "workers": workers, "rows": rows, "events": len(event_s),
        "deadline_every": deadline_every, "counts": list(counts), "min_count": min_count, "queued_at_end": queued,
        "event_ms": {k: (v * 1e3 if isinstance(v, float) else v) for k, v in ev.items()},
        "event_mean_ms": float(np.mean(event_s)) * 1e3 if event_s else None,
        "submit_us": submit_s / submitted * 1e6 if submitted else None,
        "groups_per_s": done / (sum(event_s) + submit_s) if event_s else None,
    }


ELASTIC = {"deadline_every": 1, "counts": (8,), "min_count": 2}  # the elastic workload (sweep(elastic=True))


def sweep(depths=(100, 1000, 5000, 10_000), modes=("dispatch", "step"), *, events: int = 400,
          deadline_every: int = 0, progress=None, baseline: str | None = None, same_events: bool = False,
          elastic: bool = False) -> list[dict]:
    """Every (mode, depth) point, each in a fresh process (no heap or caches carried over). With
    `baseline` (a checkout of an older revision), each point runs there too, right before this one: the
    two engines measured side by side on the same machine state (rows with "revision": "baseline");
    `same_events`: as many events there as here (else fewer at deep queues, for an O(queue) engine).
    `elastic`: every group of 8 candidates with a deadline and at least 2 (choose_count at every pass);
    fewer warm-up events, since an engine that sums the elastic groups one by one takes seconds each."""
    workload = dict(ELASTIC) if elastic else {"deadline_every": deadline_every, "counts": (1,), "min_count": None}
    warmup = 10 if elastic else 50
    rows = []
    for mode in modes:
        for depth in depths:
            if baseline is not None:
                # an old engine is O(queue) per event: fewer events keep its deep points within a minute
                fewer = max(10, 20_000 // depth) if elastic else max(40, 400_000 // depth)
                n = events if same_events else min(events, fewer)
                rows.append({**_point(baseline, mode, depth, n, workload, warmup), "revision": "baseline"})
                if progress is not None:
                    progress(rows[-1])
            rows.append({**_point(None, mode, depth, events, workload, warmup), "revision": "current"})
            if progress is not None:
                progress(rows[-1])
    return rows


SIZES = (32, 128, 512)  # fleet sizes of sweep_sizes


def sweep_sizes(sizes=SIZES, modes=("dispatch", "step"), *, depth: int = 1000, events: int = 300, progress=None,
                baseline: str | None = None) -> list[dict]:
    """Every group with a deadline, `depth` queued, against the number of workers: a refusal check reads
    the fleet at every submission, and a planning pass at every event. Each point in a fresh process; with
    `baseline`, that revision's right before this one's (as in `sweep`)."""
    workload = {"deadline_every": 1, "counts": (1,), "min_count": None, "burst_fill": True}
    rows = []
    for mode in modes:
        for size in sizes:
            for root in ((baseline, None) if baseline is not None else (None,)):
                row = _point(root, mode, depth, events, {**workload, "workers": size}, warmup=50)
                rows.append({**row, "revision": "baseline" if root is not None else "current"})
                if progress is not None:
                    progress(rows[-1])
    return rows


def _point(root: str | None, mode: str, depth: int, events: int, workload: dict, warmup: int) -> dict:
    """One point in a child process; with `root`, against the engine of the checkout there (this file
    drives only the engine's public API, which older revisions have too)."""
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = root
    args = {"batching": mode, "depth": depth, "events": events, "warmup": warmup, **workload}
    cmd = [sys.executable, os.path.abspath(__file__), json.dumps(args)]
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # one point, as JSON: python fleet_engine.py '{"batching": ..., "depth": ..., ...}'
    try:  # the collector as the scheduler's process sets it (the checkout's own, for a baseline)
        from candidate_scheduler.gc_tuning import tune_gc
    except ImportError:  # a checkout from before gc_tuning.py kept it in commands.py (or had none)
        tune_gc = getattr(importlib.import_module("candidate_scheduler.commands"), "tune_gc", lambda: None)
    tune_gc()
    point = json.loads(sys.argv[1])
    point["counts"] = tuple(point["counts"])
    print(json.dumps(time_per_event(point.pop("batching"), point.pop("depth"), **point)))
