"""Deadline groups of mixed urgency on alike workers, in simulated time: what filling a dispatch batch
costs the groups due soonest, and what the batch guard (core/batch_deadlines.py) gives back.

The fleet and the groups are bench/margin_sim.py's (two dispatch workers of 8 rows, both as fast as their
profile says; groups of 4 candidates, 10 steps, Poisson arrivals for 60 s), except that the deadlines come
in turn from a mix: a robot's control loop (0.4-0.5 s) beside a planner's or an evaluation's (1-3 s).
Under earliest-deadline-first the urgent group heads its batch; a batch of 8 rows is 1.5x as long as one
of 4, so a looser group filling it can push the urgent one past its deadline, where alone it was in time.

Each rate runs with a baseline checkout's engine (when given) and this one's, in child processes with the
same arrivals (`margin_sim.run_point`): `python -m candidate_scheduler.bench.deadline_mix [--baseline DIR
--baseline-rev REV] [--out DIR]`. Not part of `make bench`: the engine alone, no processes, about a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from candidate_scheduler.bench.margin_sim import DEFAULT, ROWS, SAMPLING, outcome_counts, run_point

MIXES = ((0.5, 2.0), (0.4, 1.0, 3.0))
RATES = (6.0, 8.0, 10.0, 12.0)
SEEDS = (20261206, 7)


def compare(baseline: str | None, mixes=MIXES, rates=RATES, seeds=SEEDS, **kw) -> list[dict]:
    rows = []
    for mix in mixes:
        for rate in rates:
            for seed in seeds:
                args = {**DEFAULT, **kw, "rate": rate, "seed": seed, "slowdown": 1.0, "deadlines": list(mix)}
                for name, root in ((("baseline", baseline),) if baseline else ()) + (("current", None),):
                    r = run_point(root, args)
                    rows.append({"engine": name, "mix": list(mix), "rate": rate, "seed": seed, **_counts(r)})
                    print(f"[deadline_mix] {name}, deadlines {mix}, {rate:g} groups/s, seed {seed}: "
                          f"{rows[-1]['in_time']}/{rows[-1]['groups']} in time, refused {rows[-1]['refused']}, "
                          f"expired {rows[-1]['expired']}", file=sys.stderr, flush=True)
    return rows


def _counts(run: dict) -> dict:
    refused, expired, o = outcome_counts(run["outcomes"])
    return {"groups": run["groups"], "in_time": run["in_time"], "refused": refused, "expired": expired,
            "other": o, "batches": run["batches"]}


def totals(rows: list[dict]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        t = out.setdefault(r["engine"], {"groups": 0, "in_time": 0, "refused": 0, "expired": 0})
        for k in t:
            t[k] += r[k]
    return out


def report(rows: list[dict], baseline_rev: str | None) -> str:
    lines = ["# Deadlines of mixed urgency, in simulated time (bench/deadline_mix.py)", "",
             f"Two alike dispatch workers of {ROWS} rows; groups of {DEFAULT['count']} candidates (served in full or "
             f"refused), {SAMPLING['steps']} steps, deadlines taken in turn from the mix, Poisson arrivals for "
             f"{DEFAULT['seconds']:g} s, two arrival seeds a point. Baseline: {baseline_rev or 'none'}.", "",
             "| deadlines (s) | offered groups/s | seed | engine | groups | in time | refused at receipt | expired | other |",
             "|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {', '.join(f'{d:g}' for d in r['mix'])} | {r['rate']:g} | {r['seed']} | {r['engine']} | "
                     f"{r['groups']} | {r['in_time']} | {r['refused']} | {r['expired']} | {r['other'] or '-'} |")
    lines += ["", "| engine | groups | in time | refused at receipt | expired |", "|---|---:|---:|---:|---:|"]
    for name, t in totals(rows).items():
        lines.append(f"| {name} | {t['groups']} | {t['in_time']} | {t['refused']} | {t['expired']} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({r["engine"] for r in rows}, key=lambda e: e != "baseline")
    fig, axes = plt.subplots(1, len(MIXES), figsize=(11, 4), dpi=100, sharey=True)
    for ax, mix in zip(axes, MIXES):
        for engine, color in zip(engines, ("#888888", "#0072b2")):
            pts = [(r["rate"], r) for r in rows if r["engine"] == engine and tuple(r["mix"]) == mix]
            rates = sorted({rate for rate, _ in pts})
            expired = [sum(r["expired"] for rate, r in pts if rate == x) for x in rates]
            missed = [sum(r["groups"] - r["in_time"] for rate, r in pts if rate == x) for x in rates]
            ax.plot(rates, missed, marker="o", color=color, label=f"{engine}: not in time (refused + expired)")
            ax.plot(rates, expired, marker="x", linestyle="--", color=color, label=f"{engine}: expired")
        ax.set_title(f"deadlines {', '.join(f'{d:g}' for d in mix)} s")
        ax.set_xlabel("offered groups/s")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("groups (two seeds)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=None, help="a checkout of an earlier revision to run beside this one")
    p.add_argument("--baseline-rev", default=None, help="its revision, for the report")
    p.add_argument("--out", default=None, help="folder for deadline_mix.json, .md and .png")
    a = p.parse_args(argv)
    rows = compare(a.baseline)
    text = report(rows, a.baseline_rev)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "deadline_mix.json").write_text(json.dumps(rows, indent=1))
        (out / "deadline_mix.md").write_text(text)
        plot(rows, out / "deadline_mix.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
