"""The cost model's forecasts on an idle worker: each assignment's measured time over its prediction.

A client of a running scheduler (`candidate-scheduler up --workers 1 --warmup-shapes 64x64,256x256`)
that sends one group at a time, in phases a robot, an evaluation or an RL job would produce: fresh
observations (every group a new frame), the same observation again (retries, groups of one prompt), and
at 256x256 a small pool the worker has cached, then fresh ones. The scheduler is started apart, so the
same client measures any build of it side by side (before and after a cost-model change):

    python -m candidate_scheduler.bench.forecast_idle --out run.json [--tag after]
    python -m candidate_scheduler.bench.forecast_idle --compare before.json after.json > table.md

Idle means one group in flight: a forecast here is the cost model alone, with no queue to model.

Then the elastic check (#21, as a new user tried it): at 256x256, a count-32 group with min_count 2 and a
deadline of 1.5x a count-8 group's latency, a fresh observation each time. The count the scheduler picks
is a promise; every admitted group must be answered `done` within its deadline.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import forecast_errors, git_rev

COUNTS = (1, 2, 4, 8)
# (phase name, side, observation kind, rounds over COUNTS): the order is the point -- a cost model that
# learned one kind of traffic meets the next
PHASES = (
    ("64x64 fresh", 64, "fresh", 3),
    ("64x64 same observation", 64, "same", 3),
    ("64x64 fresh again", 64, "fresh", 2),
    ("256x256 cached pool", 256, "pool", 2),
    ("256x256 fresh", 256, "fresh", 1),
)


def run(endpoint: str, control: str, steps: int = 20, elastic_trials: int = 8, phases_too: bool = True) -> dict:
    from candidate_scheduler import Client, synthetic_image

    phases, groups, seen = [], [], set()
    seed = 1000

    def send(client, img, count: int, side: int, phase: str) -> dict:
        key = hashlib.sha256(img.tobytes()).digest()
        reply = client.submit(img, "pick up the red cube", count=count, seed=seed, steps=steps,
                              height=side, width=side)
        if reply.status != "done":
            raise RuntimeError(f"{phase}: a count-{count} group was answered {reply.status}")
        m = reply.metrics
        # the fixed cost the worker measured, and whether this observation was new to it (one worker, a
        # cache far larger than these few observations: the client knows)
        groups.append({"phase": phase, "label": f"{side}x{side}", "count": count, "fresh": key not in seen,
                       "fixed_s": float(m.get("condition_s", 0.0)) + float(m.get("postprocess_s", 0.0)),
                       "measured_s": sum(f["measured_s"] for f in m.get("forecasts") or ())})
        seen.add(key)
        return m

    with Client(endpoint, control) as client:
        for name, side, kind, rounds in PHASES if phases_too else ():
            same = synthetic_image(side, side, seed=7)
            pool = [synthetic_image(side, side, seed=s) for s in (11, 12)]
            for img in (*pool, same):  # the worker caches these before the phase is measured
                send(client, img, 1, side, f"{name} (caching)")
            metrics = []
            for r in range(rounds):
                for i, count in enumerate(COUNTS):
                    seed += 1
                    if kind == "fresh":
                        img = synthetic_image(side, side, seed=seed)
                    else:
                        img = same if kind == "same" else pool[(r + i) % 2]
                    metrics.append(send(client, img, count, side, name))
            ratios = [f["measured_s"] / f["predicted_s"] for m in metrics for f in m.get("forecasts") or ()
                      if f.get("predicted_s", 0) > 0]
            phases.append({"phase": name, "ratios": ratios, "errors": forecast_errors(metrics)})
            print(f"forecast_idle: {name}: {len(ratios)} assignments, p50 "
                  f"{np.median(ratios):.2f}", file=sys.stderr, flush=True)
        trials = elastic(client, elastic_trials, steps) if elastic_trials else []
    return {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git": git_rev(),
            "steps": steps, "phases": phases, "groups": groups, "elastic": trials}


def elastic(client, trials: int, steps: int, side: int = 256) -> list[dict]:
    """`trials` elastic groups (see the module docstring); the deadline is 1.5x the quicker of two
    count-8 groups' latencies, measured after one that warms the shape up."""
    from candidate_scheduler import synthetic_image

    seed, latencies, out = 90_000, [], []
    for _ in range(3):
        seed += 1
        started = time.monotonic()
        client.submit(synthetic_image(side, side, seed=seed), "pick up the red cube", count=8, seed=seed,
                      steps=steps, height=side, width=side)
        latencies.append(time.monotonic() - started)
    deadline = 1.5 * min(latencies[1:])
    for _ in range(trials):
        seed += 1
        started = time.monotonic()
        reply = client.submit(synthetic_image(side, side, seed=seed), "pick up the red cube", count=32, min_count=2,
                              deadline_s=deadline, seed=seed, steps=steps, height=side, width=side)
        out.append({"status": reply.status, "served": reply.served_count, "elapsed_s": time.monotonic() - started,
                    "deadline_s": deadline, "forecasts": reply.metrics.get("forecasts") or []})
        print(f"forecast_idle: elastic: {reply.status}, {reply.served_count} served in {out[-1]['elapsed_s']:.3f} s "
              f"(deadline {deadline:.3f} s)", file=sys.stderr, flush=True)
    return out


def elastic_table(trials: list[dict]) -> str:
    """One row: how many elastic groups were done in time, the counts served, the slack left, and the
    worst measured / predicted among their assignments. In time by the client's clock, which adds the
    link to the scheduler's receipt-to-reply time: stricter than the deadline itself."""
    if not trials:
        return ""
    in_time = [t for t in trials if t["status"] == "done" and t["elapsed_s"] <= t["deadline_s"]]
    served = sorted(t["served"] for t in trials if t["served"])
    slack = [t["deadline_s"] - t["elapsed_s"] for t in in_time]
    ratios = [f["measured_s"] / f["predicted_s"] for t in trials for f in t["forecasts"] if f.get("predicted_s", 0) > 0]
    cells = [str(len(trials)), f"{len(in_time)}", ", ".join(sorted({t['status'] for t in trials} - {"done"})) or "-",
             f"{served[0]}-{served[-1]}" if served else "-",
             f"{1e3 * min(slack):.0f} / {1e3 * float(np.median(slack)):.0f}" if slack else "-",
             f"{max(ratios):.2f}" if ratios else "-"]
    return ("| elastic groups | done in time | other answers | served | slack ms (min / p50) "
            "| worst measured / predicted |\n|---|---|---|---|---|---|\n| " + " | ".join(cells) + " |\n")


def summary_row(ratios: list[float]) -> tuple[float, float, float, float]:
    arr = np.asarray(ratios)
    return (float(np.percentile(arr, 10)), float(np.median(arr)), float(np.percentile(arr, 90)),
            float(np.mean(np.abs(arr - 1) <= 0.1)))


def compare(runs: list[dict]) -> str:
    """One markdown table: per phase, each run's p10/p50/p90 of measured / predicted and the share within 10%."""
    runs = [r for r in runs if r["phases"]]  # an --elastic-only run has none
    if not runs:
        return ""
    tags = [r.get("tag") or r["git"] for r in runs]
    lines = ["| phase | assignments | " + " | ".join(f"{t}: p10 / p50 / p90, within 10%" for t in tags) + " |",
             "|---|---|" + "---|" * len(runs)]
    for i, phase in enumerate(runs[0]["phases"]):
        cells = []
        for r in runs:
            p10, p50, p90, within = summary_row(r["phases"][i]["ratios"])
            cells.append(f"{p10:.2f} / **{p50:.2f}** / {p90:.2f}, {within:.0%}")
        lines.append(f"| {phase['phase']} | {len(phase['ratios'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def replay_fixed(groups: list[dict]) -> str:
    """The fixed-cost part alone, on the measured groups in their order, two ways: the cost model's (one
    running mean per shape over every group, core/cost_model.py) and one told whether each observation is
    new to the worker (a running mean for each kind), as a scheduler that tracked what each worker has
    cached could be. Each prediction is made before its group is observed, so the step-time noise that
    swamps the end-to-end ratios is not in it."""
    from candidate_scheduler.core.cost_model import CostModel, Ewma

    model, told = CostModel(), {}
    errors: dict[str, dict[str, list[float]]] = {}
    for g in groups:
        kinds = told.setdefault(g["label"], {True: Ewma(), False: Ewma()})
        own = kinds[g["fresh"]] if kinds[g["fresh"]].n else kinds[not g["fresh"]]
        predictions = {"the cost model": model.overhead_s("w", g["label"]), "told fresh or cached": own.value}
        if not g["phase"].endswith("(caching)") and own.n:
            for name, predicted in predictions.items():
                errors.setdefault(g["phase"], {}).setdefault(name, []).append(abs(predicted - g["fixed_s"]))
        model.observe_group("w", g["label"], {"condition_s": g["fixed_s"], "groups": 1})
        kinds[g["fresh"]].observe(g["fixed_s"])
    names = ("the cost model", "told fresh or cached")
    lines = ["| phase | groups | measured fixed ms (median) | " + " | ".join(f"{n}: mean abs error ms" for n in names)
             + " |", "|---|---|---|" + "---|" * len(names)]
    for phase, by_model in errors.items():
        fixed = [g["fixed_s"] for g in groups if g["phase"] == phase]
        lines.append(f"| {phase} | {len(fixed)} | {1e3 * float(np.median(fixed)):.1f} | "
                     + " | ".join(f"{1e3 * float(np.mean(by_model[n])):.1f}" for n in names) + " |")
    return "\n".join(lines) + "\n"


def noise_floor(groups: list[dict]) -> str:
    """How far identical work lands from itself: per phase, each group's measured time over the median
    of the same count's groups in that phase. A forecast that knew each count's median exactly would be
    within 10% only this often -- the floor under the ratios above on this machine."""
    lines = ["| phase | groups | p10 | p90 | within 10% of the count's median |", "|---|---|---|---|---|"]
    for phase in dict.fromkeys(g["phase"] for g in groups if not g["phase"].endswith("(caching)")):
        ratios = []
        for count in COUNTS:
            times = [g["measured_s"] for g in groups if g["phase"] == phase and g["count"] == count]
            ratios += [t / float(np.median(times)) for t in times] if len(times) > 1 else []
        if ratios:
            arr = np.asarray(ratios)
            lines.append(f"| {phase} | {arr.size} | {np.percentile(arr, 10):.2f} | {np.percentile(arr, 90):.2f} "
                         f"| {np.mean(np.abs(arr - 1) <= 0.1):.0%} |")
    return "\n".join(lines) + "\n"


def tables(run: dict) -> str:
    name = run.get("tag") or run["git"]
    elastic_rows = elastic_table(run.get("elastic") or [])
    phases = (f"\nFixed cost per group replayed from {name} ({run['created']}):\n\n" + replay_fixed(run["groups"])
              + f"\nNoise floor in {name}:\n\n" + noise_floor(run["groups"])) if run["groups"] else ""
    return phases + (f"\nElastic groups in {name}:\n\n" + elastic_rows if elastic_rows else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default="tcp://127.0.0.1:5555")
    p.add_argument("--control", default="tcp://127.0.0.1:5556")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--elastic", type=int, default=8, metavar="N", help="elastic groups to send at the end (0: none)")
    p.add_argument("--elastic-only", action="store_true",
                   help="only the elastic groups: as a new user meets them, on a worker that has seen nothing yet")
    p.add_argument("--out", type=Path)
    p.add_argument("--tag", default="", help="the build measured, for the comparison's columns")
    p.add_argument("--compare", nargs="+", type=Path, help="runs' JSON files: print their table and exit")
    args = p.parse_args(argv)
    if args.compare:
        runs = [json.loads(path.read_text()) for path in args.compare]
        print(compare(runs), end="")
        for r in (r for r in runs if r.get("groups") or r.get("elastic")):
            print(tables(r), end="")
        return 0
    result = {**run(args.endpoint, args.control, args.steps, args.elastic, not args.elastic_only), "tag": args.tag}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(compare([result]) + tables(result), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
