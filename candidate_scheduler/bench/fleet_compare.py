"""Two builds' fleet runs side by side: `fleet.json` files of `bench --fleet`, some from the build before a
change and some from the build after, run one after the other on the same machine.

    python -m candidate_scheduler.bench.fleet_compare --before b1/fleet.json b2/fleet.json \
        --after a1/fleet.json a2/fleet.json > compare.md

Per fleet size, batching mode and workload: utilisation and the scheduler's CPU per group answered,
each as the range over the runs of that build. On a shared 2-core machine one pair proves little; run the
pairs in both orders (before then after, after then before) so that a drift of the machine shows as
overlapping ranges rather than as a gain.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from candidate_scheduler.bench.fleet_report import cpu_us_per_group


def _key(run: dict) -> tuple:
    return run["workers"], run["batching"], run["workload"]["name"]


def _span(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if lo == hi else f"{lo:.{digits}f}-{hi:.{digits}f}"


def compare(before: list[dict], after: list[dict]) -> str:
    """A markdown table over the runs present in both builds (see the module docstring)."""
    def by_key(results: list[dict]) -> dict[tuple, list[dict]]:
        out: dict[tuple, list[dict]] = {}
        for result in results:
            for run in result["fleet"]["runs"]:
                out.setdefault(_key(run), []).append(run)
        return out

    def revs(results: list[dict]) -> str:
        return ", ".join(sorted({r["meta"]["git"] for r in results}))

    def us(runs: list[dict]) -> list[float]:
        return [v for v in (cpu_us_per_group(r, "scheduler") for r in runs) if v is not None]

    b, a = by_key(before), by_key(after)
    lines = [f"Before: {revs(before)} ({len(before)} runs); after: {revs(after)} ({len(after)} runs).", "",
             "| K | mode | workload | utilisation before | after | scheduler us/group before | after | every reply checked |",
             "|---:|---|---|---|---|---|---|---|"]
    for key in sorted(b.keys() & a.keys()):
        runs_b, runs_a = b[key], a[key]
        checked = all(r["check"]["replies"] == r["check"]["groups"] and r["check"]["wrong_results"] == 0
                      for r in runs_b + runs_a)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {_span([r['utilisation'] for r in runs_b], 2)} | "
                     f"{_span([r['utilisation'] for r in runs_a], 2)} | {_span(us(runs_b), 0)} | "
                     f"{_span(us(runs_a), 0)} | {'yes' if checked else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", nargs="+", type=Path, required=True, help="fleet.json files of the earlier build")
    p.add_argument("--after", nargs="+", type=Path, required=True, help="fleet.json files of the later build")
    args = p.parse_args(argv)
    before, after = ([json.loads(path.read_text()) for path in paths] for paths in (args.before, args.after))
    print(compare(before, after), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
