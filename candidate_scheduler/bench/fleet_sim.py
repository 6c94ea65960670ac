"""The engine in process under the scheduler's defaults, on a simulated clock: what an event costs on
a large fleet when work is prefetched late and starts are staggered.

bench/fleet_engine.py answers one result after another with no time between them, so it turns late
prefetch and staggered starts off (they are timed by the shell's wake-up passes). Here the fake
workers keep a clock instead: a batch sent to a worker starts when the worker is free (dispatch), or
when enough of its rows are (step), and runs `steps` forwards of the very time its warm-up profile
reports, so the engine's predictions hold. The loop takes the next thing to happen -- a result, or
the engine's own wake-up (`Engine.wake_at`), as the shell's poll timeout would -- and times each
engine call. The queue is held deep (every group answered is replaced), deep enough that a
best-effort backlog staggers the starts.

What is reported per point: the engine's wall time per result event (fold, reply, plan), per wake-up
pass, per submission, and per group answered (all calls together); and the simulated utilisation, the
workers' busy time over the simulated time, which shows the run kept the fleet busy (a pass that
placed too little would make the figures cheap and wrong).

With `charge` (the default since 2026-12-03; the runs committed before it did not), the engine's wall
time is charged to the simulated clock, as a scheduler's one loop thread spends it: what a call sends
leaves when the call returns, and nothing else happens meanwhile. The utilisation then answers whether
one core of this machine, running this engine, keeps a fleet of that size busy -- a wave placed in one
pass leaves the workers placed last idle for as long as the pass takes.
"""

from __future__ import annotations

import heapq
import importlib
import itertools
import json
import os
import subprocess
import sys
import time

from candidate_scheduler.bench.common import summary_stats
from candidate_scheduler.bench.fleet_engine import FakeFleet
from candidate_scheduler.core.engine import EngineConfig
from candidate_scheduler.core.messages import SendWork

SIZES = (32, 128, 512)
STEPS, STEP_S = 20, 0.15  # a full batch takes 3 s: spaced over 512 workers, 5.9 ms apart (stagger's floor is 5)


class ClockedFleet(FakeFleet):
    """FakeFleet with the scheduler's defaults and a simulated clock (see the module docstring)."""

    def __init__(self, batching: str, workers: int, rows: int, *, charge: bool = False, **kwargs) -> None:
        self.charge = charge  # the engine's wall time passes on the simulated clock too (module docstring)
        self.events: list = []  # (time, seq, kind, payload)
        self._seq = itertools.count()
        self.free_at: dict[bytes, float] = {}  # dispatch: when the worker's last batch ends
        self.running: dict[bytes, list[tuple[float, int]]] = {}  # step: (end, rows) of what it runs
        self.busy_s = 0.0
        self._wake: float | None = None
        self.rows, self.step_s = rows, kwargs.get("step_s", STEP_S)
        self.timed: dict[str, list[float]] = {"result": [], "wake": [], "submit": []}
        super().__init__(batching, workers, rows, **kwargs)
        # FakeFleet turns late prefetch and staggered starts off (it has no clock); this one has the
        # scheduler's defaults, set before any group arrives (the registrations read neither)
        defaults = EngineConfig()
        for knob in ("prefetch_lead_s", "stagger"):
            if hasattr(defaults, knob):
                setattr(self.engine.config, knob, getattr(defaults, knob))

    def _forward_s(self, rows: int) -> float:  # what the warm-up profile reports (FakeFleet)
        return self.step_s * (0.5 + 0.5 * rows / self.rows)

    def take(self, out: list) -> None:
        for m in out:
            if isinstance(m, SendWork):
                rows = sum(len(sw.dispatch.candidate_ids) for sw in m.slices)
                if self.engine.config.batching == "dispatch":
                    start = max(self.now, self.free_at.get(m.identity, self.now))
                    end = self.free_at[m.identity] = start + self.steps * self._forward_s(rows)
                else:
                    start = self._rows_free_at(m.identity, rows)
                    end = start + self.steps * self._forward_s(self.rows)  # a full batch's pace: an estimate
                    self.running[m.identity].append((end, rows))
                self.busy_s += (end - start) * (rows / self.rows if self.engine.config.batching == "step" else 1)
                heapq.heappush(self.events, (end, next(self._seq), "result", m))
            elif type(m).__name__ == "Reply":
                self.answered += 1
        wake = self.engine.wake_at
        if wake is not None and (self._wake is None or wake < self._wake):
            self._wake = max(wake, self.now)
            heapq.heappush(self.events, (self._wake, next(self._seq), "wake", None))

    def _rows_free_at(self, identity: bytes, rows: int) -> float:
        running = [(end, r) for end, r in self.running.get(identity, ()) if end > self.now]
        self.running[identity] = running
        used, start = sum(r for _end, r in running), self.now
        for end, r in sorted(running):
            if used + rows <= self.rows:
                break
            used, start = used - r, end
        return start

    def step(self) -> bool:
        """Let the next thing happen; False when nothing is left to happen."""
        if not self.events:
            return False
        when, _seq, kind, payload = heapq.heappop(self.events)
        self.now = max(self.now, when)
        if kind == "wake":
            if when != self._wake:
                return True  # superseded by an earlier wake-up
            self._wake = None
            t0 = time.perf_counter()
            out = self.engine.plan(self.now)
            self._spent("wake", time.perf_counter() - t0)
            self.take(out)
            return True
        t0 = time.perf_counter()
        before = self.answered
        out = self.engine.worker_result(payload.identity, self.result_of(payload), self.now)
        self._spent("result", time.perf_counter() - t0)
        self.take(out)
        for _ in range(self.answered - before):  # the queue held at its depth: one new group per answer
            self.timed["submit"].append(self.submit(1))
        return True

    def _spent(self, call: str, seconds: float) -> None:
        self.timed[call].append(seconds)
        self._charge(seconds)

    def _charge(self, seconds: float) -> None:
        if self.charge:  # the loop was busy: what the call sends leaves, and the next event is taken, after it
            self.now += seconds

    def submit(self, n: int, plan: bool = True) -> float:
        """FakeFleet.submit, each submission's time charged before what it sends leaves (defined here, not
        there: a baseline run drives an older revision's FakeFleet with this file)."""
        spent = 0.0
        for _ in range(n):
            sub = self.submission()
            t0 = time.perf_counter()
            out = self.engine.submit(("client", sub.request_id), sub, self.now, plan=plan)
            took = time.perf_counter() - t0
            spent += took
            self._charge(took)
            self.take(out)
        return spent


def run_point(batching: str, workers: int, *, rows: int = 8, results: int = 1500, warmup: int = 300,
              depth_waves: int = 10, deadline_every: int = 0, charge: bool = True) -> dict:
    """One fleet size: `depth_waves` x the fleet's rows queued, `results` result events timed after
    `warmup`; `charge`: the engine's time passes on the simulated clock (module docstring). Under step
    batching a result answers one group, not a batch of `rows`: there both counts are `rows` times as
    many, so that every point's window holds as many groups (at 512 workers, 1,500 step results were a
    third of one batch period, and the figures said where the window cut the waves)."""
    fleet = ClockedFleet(batching, workers, rows, steps=STEPS, step_s=STEP_S, deadline_every=deadline_every,
                         charge=charge)
    fleet.submit(depth_waves * workers * rows, plan=False)
    fleet.plan()
    per_result = 1 if batching == "dispatch" else rows
    start_now = None
    while fleet.step():
        if start_now is None and len(fleet.timed["result"]) >= warmup * per_result:
            start_now, busy0, answered0 = fleet.now, fleet.busy_s, fleet.answered
            for series in fleet.timed.values():
                series.clear()
        elif start_now is not None and len(fleet.timed["result"]) >= results * per_result:
            break
    elapsed = fleet.now - start_now
    spent = sum(sum(series) for series in fleet.timed.values())
    answered = fleet.answered - answered0
    return {
        "batching": batching, "workers": workers, "rows": rows, "deadline_every": deadline_every,
        "charged": charge, "steps": STEPS, "step_s": STEP_S, "queued_at_end": fleet.engine.queued_groups(),
        "result_us": {k: v * 1e6 for k, v in summary_stats(fleet.timed["result"]).items() if k != "n"},
        "wake_us": {k: v * 1e6 for k, v in summary_stats(fleet.timed["wake"]).items() if k != "n"},
        "wakes_per_result": len(fleet.timed["wake"]) / max(1, len(fleet.timed["result"])),
        "submit_us": 1e6 * sum(fleet.timed["submit"]) / max(1, len(fleet.timed["submit"])),
        "engine_us_per_group": 1e6 * spent / max(1, answered),
        "staggered_starts": fleet.engine.counters.get("staggered_starts", 0),
        # busy time counted when a batch is sent, over the window's simulated time: near 1 when kept busy
        # (under step batching an estimate: a joiner's forwards are counted at a full batch's pace)
        "utilisation": (fleet.busy_s - busy0) / (workers * elapsed) if elapsed > 0 else None,
        # groups answered per simulated second, over what the fleet answers with every row busy
        "answered_over_ideal": answered / elapsed / (workers * rows / (STEPS * STEP_S)) if elapsed > 0 else None,
        # the share of the simulated time the engine's calls took (charged or not)
        "loop_busy": spent / elapsed if elapsed > 0 else None,
    }


def sweep(sizes=SIZES, modes=("dispatch", "step"), *, results: int = 1500, warmup: int = 300,
          deadline_every: int = 0, baseline: str | None = None, progress=None) -> list[dict]:
    """Every (mode, size) point, each in a fresh process; with `baseline` (a checkout of an older
    revision), each point there too, right before this one (rows with "revision": "baseline"), driven by
    this file: only the engine's public API and FakeFleet, which older revisions have too."""
    rows = []
    for mode in modes:
        for size in sizes:
            args = {"batching": mode, "workers": size, "results": results, "warmup": warmup,
                    "deadline_every": deadline_every}
            for root in ((baseline, None) if baseline is not None else (None,)):
                env = dict(os.environ)
                if root is not None:
                    env["PYTHONPATH"] = root
                out = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(args)], env=env, cwd=root,
                                     capture_output=True, text=True, timeout=900, check=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append({**row, "revision": "baseline" if root is not None else "current"})
                if progress is not None:
                    progress(rows[-1])
    return rows


if __name__ == "__main__":  # one point, as JSON: python fleet_sim.py '{"batching": ..., "workers": ..., ...}'
    # as fleet_engine's points do: each file runs alone against a baseline checkout, so neither imports this
    try:  # the collector as the scheduler's process sets it (the checkout's own, for a baseline)
        from candidate_scheduler.gc_tuning import tune_gc
    except ImportError:  # a checkout from before gc_tuning.py kept it in commands.py (or had none)
        tune_gc = getattr(importlib.import_module("candidate_scheduler.commands"), "tune_gc", lambda: None)
    tune_gc()
    point = json.loads(sys.argv[1])
    print(json.dumps(run_point(point.pop("batching"), point.pop("workers"), **point)))
