"""The engine's calls for one group, back to back and spaced apart: what a group costs the scheduler
when groups come one at a time, as in the methods benchmark's (d), rather than in a burst.

One fake worker of 8 rows (bench/fleet_engine.py's harness) and groups of 8 candidates, one at a
time: submit it (no planning pass), plan (the worker is sent it), answer it (fold, reduce, reply).
Between two groups the process spins on the clock for the spacing, so the core never idles: a
slowdown with the spacing is not a sleeping core waking up (one point sleeps instead, to compare). It
grows with the pause, as it would if a group's code and data were leaving caches that the machine's
other processes share. Each point runs in this process, after a warm-up, and reports the median of
each call.
"""

from __future__ import annotations

import time

import numpy as np

from candidate_scheduler.bench.fleet_engine import FakeFleet

SPACINGS_S = (0.0, 0.003, 0.01, 0.03)
COUNT = 8  # candidates a group: (d)'s N


def _wait(seconds: float, how: str) -> None:
    if how == "sleep":
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def point(fleet: FakeFleet, spacing_s: float, how: str, groups: int) -> dict:
    """Median microseconds of each call over `groups` groups, `spacing_s` apart."""
    calls: dict[str, list[float]] = {"submit": [], "plan": [], "result": []}
    engine = fleet.engine
    for _ in range(groups):
        sub = fleet.submission()
        t0 = time.perf_counter()
        out = engine.submit(("client", sub.request_id), sub, fleet.now, plan=False)
        t1 = time.perf_counter()
        fleet.take(out)
        t1b = time.perf_counter()
        out = engine.plan(fleet.now)
        t2 = time.perf_counter()
        fleet.take(out)
        _bid, send = fleet.outstanding.popitem(last=False)
        result = fleet.result_of(send)
        fleet.now += 0.02
        t3 = time.perf_counter()
        out = engine.worker_result(send.identity, result, fleet.now, plan=False)
        t4 = time.perf_counter()
        fleet.take(out)
        for name, seconds in (("submit", t1 - t0), ("plan", t2 - t1b), ("result", t4 - t3)):
            calls[name].append(seconds)
        _wait(spacing_s, how)
    row = {k: float(np.median(v)) * 1e6 for k, v in calls.items()}
    total = np.median(np.sum([calls["submit"], calls["plan"], calls["result"]], axis=0)) * 1e6
    return {"spacing_ms": spacing_s * 1e3, "wait": how, "groups": groups, **{f"{k}_us": v for k, v in row.items()},
            "total_us": float(total)}


def sweep(spacings=SPACINGS_S, groups: int = 100, warmup: int = 200) -> list[dict]:
    """Every spacing, spun; the widest again asleep. One engine throughout (warmed up first)."""
    fleet = FakeFleet("dispatch", 1, 8, counts=(COUNT,))
    point(fleet, 0.0, "spin", warmup)
    rows = [point(fleet, s, "spin", groups) for s in spacings]
    rows.append(point(fleet, spacings[-1], "sleep", groups))
    return rows
