"""Deadline groups on a fleet whose workers are not alike, in simulated time: the real engine against
two simulated dispatch workers with the same warm-up profile, `b` of which runs `slowdown` times slower
than its profile says (a slower device, a busier host, a profile that overstates its speed); and, as a
control, the same fleet with both alike (`slowdown` 1).

What it answers: how many deadline groups the fleet serves in time, refuses at receipt, or answers
late, when the forecast margin is kept for the whole fleet (an earlier revision's engine, run from its
checkout) against kept per worker (core/margins.py). Each arm runs in a child process, the current
one right after the earlier one, with the same Poisson arrivals (`compare`; `python -m
candidate_scheduler.bench.margin_sim [--baseline REV_CHECKOUT] [--out DIR]`).

A worker runs one batch at a time: `steps` forwards of `a + b * rows` seconds, times its slowdown; the
engine hears of the batch at its end and is ticked every `TICK_S`, as the shell does.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.open_loop import poisson_schedule
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import Registration, Reply, SendWork, SliceOutcome, WorkerResult
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.spec import ModelCapability
from candidate_scheduler.core.work import SamplingSpec

SAMPLING = {"height": 64, "width": 64, "steps": 10}
A_S, B_S = 0.01, 0.0025  # a forward of r rows: A_S + B_S * r seconds (0.03 s at 8 rows)
ROWS = 8
TICK_S = 0.05
DEFAULT = {"rate": 6.0, "seconds": 60.0, "count": 4, "deadline_s": 1.0, "seed": 20261206}


def simulate(rate: float, seconds: float, count: int, deadline_s: float, seed: int, slowdown: float = 3.0,
             deadlines: tuple[float, ...] | None = None) -> dict:
    """One run: {"outcomes": {status/error -> groups}, "in_time", "groups", per-worker batches and the
    margins `stats` shows at the end (None where the engine keeps none per worker)}. `deadlines`: the
    groups' deadlines taken in turn by arrival (bench/deadline_mix.py); default every one `deadline_s`."""
    deadlines = tuple(deadlines or (deadline_s,))
    # no heartbeats here: a worker is never declared dead
    engine = Engine(EngineConfig(batching="dispatch", prefetch=0, max_queued_groups=100_000,
                                 heartbeat_timeout_s=1e12))
    label = SamplingSpec(**SAMPLING).forward_label()
    capability = ModelCapability("sim", reducers=("mean",), max_candidates_per_batch=ROWS,
                                 max_candidates_per_group=256).to_dict()
    profile = tuple((label, r, A_S + B_S * r) for r in (1, ROWS // 2, ROWS))
    workers = {"a": 1.0, "b": slowdown}  # worker -> how many times slower than its profile it runs
    for wid in workers:
        engine.register(wid.encode(), Registration(wid, capability, ROWS, profile=profile), 0.0)
    arrivals = poisson_schedule(rate, seconds, seed)
    image = np.zeros((SAMPLING["height"], SAMPLING["width"], 3), dtype=np.uint8)
    spec = SamplingSpec(**SAMPLING)
    actions = np.zeros((1, 1, spec.horizon, spec.raw_action_dim), np.float32)  # one candidate's
    events: list = []
    seq = itertools.count()
    replies: dict[str, tuple[float, object]] = {}
    batches = dict.fromkeys(workers, 0)
    for i, t in enumerate(arrivals):
        heapq.heappush(events, (t, next(seq), "submit", i))

    def handle(out: list, now: float) -> None:
        for m in out:
            if isinstance(m, SendWork):
                wid = m.identity.decode()
                rows = sum(len(sw.dispatch.candidate_ids) for sw in m.slices)
                run_s = SAMPLING["steps"] * (A_S + B_S * rows) * workers[wid]
                heapq.heappush(events, (now + run_s, next(seq), "result", m))
                batches[wid] += 1
            elif isinstance(m, Reply):
                if m.result.request_id in replies:
                    raise AssertionError(f"{m.result.request_id} answered twice")
                replies[m.result.request_id] = (now, m.result)

    next_tick = 0.0
    while events:
        t, _, kind, payload = heapq.heappop(events)
        while next_tick <= t:
            handle(engine.tick(next_tick), next_tick)
            next_tick += TICK_S
        if kind == "submit":
            sub = Submission(str(payload), image, "pick", {"count": count, "reducer": "mean", "min_count": count},
                             payload, dict(SAMPLING), deadline_s=deadlines[payload % len(deadlines)])
            handle(engine.submit(("sim", payload), sub, t), t)
        else:
            outputs = tuple(SliceOutcome(sw.dispatch.request_id, "ok", sw.dispatch.candidate_ids,
                                         np.repeat(actions, len(sw.dispatch.candidate_ids), axis=0))
                            for sw in payload.slices)
            result = WorkerResult(payload.identity.decode(), payload.batch_id, outputs, {"transformer_forwards": 1})
            handle(engine.worker_result(payload.identity, result, t), t)
    for _ in range(int(max(deadlines) / TICK_S) + 2):
        handle(engine.tick(next_tick), next_tick)
        next_tick += TICK_S
    outcomes: dict[str, int] = {}
    in_time = 0
    for i, at in enumerate(arrivals):
        now, r = replies.get(str(i), (None, None))
        key = "no_reply" if r is None else (r.status if r.status == "done" else r.error_code or r.status)
        outcomes[key] = outcomes.get(key, 0) + 1
        in_time += r is not None and r.status == "done" and now - at <= deadlines[i % len(deadlines)] + 1e-9
    stats = engine.stats()
    margins = {wid: stats["workers"][wid].get("forecast_margin") for wid in workers}
    return {"groups": len(arrivals), "in_time": in_time, "outcomes": outcomes, "batches": batches,
            "fleet_margin": stats.get("forecast_margin"), "worker_margins": margins,
            "goodput_groups_per_s": in_time / seconds}


def outcome_counts(outcomes: dict[str, int]) -> tuple[int, int, dict[str, int]]:
    """(refused at receipt, expired, the other outcomes but done) of a run's outcomes."""
    o = dict(outcomes)
    refused, expired = o.pop("deadline_unmeetable", 0), o.pop("deadline_exceeded", 0) + o.pop("expired", 0)
    o.pop("done", None)
    return refused, expired, o


def run_point(root: str | None, args: dict) -> dict:
    """One `simulate` in a child process, with the engine of the checkout at `root` (None: this one) and
    this harness."""
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = root
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--point", json.dumps(args)], env=env,
                         cwd=root, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(baseline: str | None, rates=(3.0, 6.0, 8.0), slowdowns=(3.0, 1.0), **kw) -> list[dict]:
    """Each fleet and rate with the baseline checkout's engine (when given), then this one's, each in a
    child process."""
    rows = []
    for slowdown in slowdowns:
        for rate in rates:
            args = {**DEFAULT, **kw, "rate": rate, "slowdown": slowdown}
            for name, root in ((("baseline", baseline),) if baseline else ()) + (("current", None),):
                rows.append({"engine": name, "rate": rate, "slowdown": slowdown, **run_point(root, args)})
                print(f"[margin_sim] {name}, b {slowdown:g}x slow, {rate:g} groups/s: "
                      f"{rows[-1]['in_time']}/{rows[-1]['groups']} in time, {rows[-1]['outcomes']}",
                      file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict], baseline_rev: str | None) -> str:
    lines = ["# Deadline groups on a fleet with one slow worker, in simulated time (bench/margin_sim.py)", "",
             f"Two dispatch workers of {ROWS} rows with the same warm-up profile; `b` runs `slowdown` times "
             f"slower than it says. Groups of {DEFAULT['count']} candidates (served in full "
             f"or refused), {SAMPLING['steps']} steps, deadline {DEFAULT['deadline_s']:g} s, Poisson arrivals for "
             f"{DEFAULT['seconds']:g} s. Baseline: {baseline_rev or 'none'}.", "",
             "| b's slowdown | engine | offered groups/s | groups | in time | refused at receipt | expired | other | "
             "goodput groups/s | margins (fleet / a / b) |", "|---:|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        refused, expired, o = outcome_counts(r["outcomes"])
        wm = r["worker_margins"]
        margins = f"{r['fleet_margin']:.2f} / " + " / ".join("-" if wm.get(w) is None else f"{wm[w]:.2f}"
                                                             for w in ("a", "b"))
        lines.append(f"| {r['slowdown']:g} | {r['engine']} | {r['rate']:g} | {r['groups']} | {r['in_time']} | {refused} | {expired} | "
                     f"{o or '-'} | {r['goodput_groups_per_s']:.2f} | {margins} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--point", help=argparse.SUPPRESS)
    p.add_argument("--baseline", default=None, help="a checkout of an earlier revision to run beside this one")
    p.add_argument("--baseline-rev", default=None, help="its revision, for the report")
    p.add_argument("--out", default=None, help="folder for margin_sim.json and margin_sim.md")
    a = p.parse_args(argv)
    if a.point:
        print(json.dumps(simulate(**json.loads(a.point))))
        return 0
    rows = compare(a.baseline)
    text = report(rows, a.baseline_rev)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "margin_sim.json").write_text(json.dumps(rows, indent=1))
        (Path(a.out) / "margin_sim.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
