"""`candidate-scheduler bench` / `python -m candidate_scheduler.bench`: the method, load, deadline, fleet and
fairness benchmarks.

The default run (`make bench`) does all five, one after the other. `--load` runs the load benchmark only,
`--deadline` the deadline benchmark only, `--fleet` the fleet benchmark only, `--fairness` the fairness
benchmark only, `--no-load` the method benchmark only; the smoke run (`--smoke`) is the method benchmark's
unless one of those is given. A run of more than one part writes `bench_run.json`: each part's wall time,
which is how `make bench`'s 15 minutes are checked."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from candidate_scheduler.arg_types import margin_quantile
from candidate_scheduler.bench.common import DEFAULT_MODEL, DEFAULT_OUT, git_rev, loadavg


def parts(args) -> tuple[bool, bool, bool, bool, bool]:
    """(run the method, the load, the deadline, the fleet, the fairness benchmark) for these arguments."""
    if getattr(args, "load", False):
        return False, True, False, False, False
    if getattr(args, "deadline", False):
        return False, False, True, False, False
    if getattr(args, "fleet", False):
        return False, False, False, True, False
    if getattr(args, "fairness", False):
        return False, False, False, False, True
    if getattr(args, "no_load", False):
        return True, False, False, False, False
    full = not getattr(args, "smoke", False)
    return True, full, full, full, full


def main(args) -> int:
    names = ("method", "load", "deadline", "fleet", "fairness")
    chosen = [name for name, run_it in zip(names, parts(args)) if run_it]
    runners = {"method": _methods, "load": _load, "deadline": _deadline, "fleet": _fleet, "fairness": _fairness}
    started, load_before, walls = time.perf_counter(), loadavg(), {}
    for name in chosen:
        t0 = time.perf_counter()
        code = runners[name](args)
        walls[name] = time.perf_counter() - t0
        if code:
            return code
    if len(chosen) > 1:  # the whole `make bench`: what each part took, against its 15 minutes
        _write_walls(args, walls, time.perf_counter() - started, load_before)
    return 0


def _methods(args) -> int:
    from candidate_scheduler.bench.report import summary, write_outputs
    from candidate_scheduler.bench.run import run

    result, opts = run(args)
    files = write_outputs(result, opts)
    print(f"bench: {result['meta']['wall_s']:.0f} s; wrote {files['json']}, {files['report']}"
          + (f", {len(files['plots'])} plots" if files["plots"] else ""))
    print(summary(result))
    return 0


def _load(args) -> int:
    from candidate_scheduler.bench import load

    return load.main(args)


def _deadline(args) -> int:
    from candidate_scheduler.bench.deadline import run_deadline_bench

    run_deadline_bench(Path(args.out), model=args.model, smoke=args.smoke, plot=not args.no_plots,
                       device=args.device, margin_quantile=args.deadline_margin_quantile)
    return 0


def _fleet(args) -> int:
    from candidate_scheduler.bench.fleet import run_fleet_bench

    run_fleet_bench(args.out, smoke=args.smoke, plot=not args.no_plots, baseline=args.fleet_baseline,
                    baseline_events=args.fleet_baseline_events)
    return 0


def _fairness(args) -> int:
    from candidate_scheduler.bench.fairness import run_fairness_bench, run_repeats_bench

    run_fairness_bench(args.out, smoke=args.smoke, plot_it=not args.no_plots, ablations=args.fairness_ablations)
    if args.fairness_repeats:
        run_repeats_bench(args.out, args.fairness_repeats)
    return 0


def _write_walls(args, walls: dict[str, float], total_s: float, load_before) -> None:
    record = {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git": git_rev(),
              "smoke": bool(args.smoke), "cpu_count": os.cpu_count(), "loadavg_start": load_before,
              "loadavg_end": loadavg(), "parts_s": walls, "total_s": total_s}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "bench_run_smoke.json" if args.smoke else "bench_run.json"
    (out / name).write_text(json.dumps(record, indent=2) + "\n")
    parts_text = ", ".join(f"{k} {v:.0f} s" for k, v in walls.items())
    print(f"bench: all parts {total_s:.0f} s ({total_s / 60:.1f} min: {parts_text}); wrote {out / name}")


def build_parser() -> argparse.ArgumentParser:
    from candidate_scheduler.bench.load_plan import ARMS, DEFAULT_ARMS
    from candidate_scheduler.bench.settings import NS_FULL, SHAPES

    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.bench", description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="Cosmos3 checkpoint directory (default: the tiny one)")
    p.add_argument("--smoke", action="store_true",
                   help="a short run for CI: method benchmark 1 repeat, small shape, N in {1, 8}; with --load, a "
                        "short load run (64x64, few points)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default bench/results)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--load", action="store_true", help="run only the load benchmark")
    which.add_argument("--deadline", action="store_true", help="run only the deadline benchmark")
    which.add_argument("--fleet", action="store_true",
                       help="run only the fleet benchmark: the engine against queue depth, and the scheduler against "
                            "1-32 null workers over ZMQ (--smoke: 1 and 4 workers, small bursts)")
    which.add_argument("--fairness", action="store_true",
                       help="run only the fairness benchmark: one tenant floods, another's group every 100 ms, with "
                            "and without fair queueing")
    which.add_argument("--no-load", action="store_true", help="run only the method benchmark")
    p.add_argument("--fairness-repeats", type=int, default=0, metavar="N",
                   help="with the fairness benchmark: run the arms its targets compare N times more "
                        "(fairness_repeats.md): its tail moves from run to run")
    p.add_argument("--fairness-ablations", action="store_true",
                   help="with the fairness benchmark: run every arm, the ablations too (each takes one setting away: "
                        "prefetch, late prefetch); by default only the arms the targets compare and first come first "
                        "served")

    m = p.add_argument_group("method benchmark")
    m.add_argument("--repeats", type=int, default=None, help="timed repeats per shape (default: small 40, large 15)")
    m.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None, help="shapes (default: small on cpu, all on cuda)")
    m.add_argument("--ns", nargs="+", type=int, default=None, help=f"candidate counts (default {list(NS_FULL)})")
    m.add_argument("--no-plots", action="store_true", help="write no PNG plots (both benchmarks)")
    m.add_argument("--sglang-cache", choices=["text", "cold", "warm"], default="text",
                   help="sglang's cross-request conditioning cache before each method: drop VAE entries (text, "
                        "default), drop all (cold), keep (warm)")
    m.add_argument("--main-thread", action="store_true",
                   help="run (a)-(c) on the main thread instead of a worker-style compute thread")

    g = p.add_argument_group("load benchmark")
    g.add_argument("--arms", nargs="+", choices=list(ARMS), default=None,
                   help=f"arms to run (default: {list(DEFAULT_ARMS)}; an arm whose serve flags `serve` does not "
                        "accept is skipped with a note)")
    g.add_argument("--arm-flags", action="append", default=[], metavar="ARM=FLAGS",
                   help="the extra `serve` flags of a service arm, e.g. 'dispatch=' (none) or "
                        "'step=--batching step --max-queued-groups 4096' (default: --batching <arm>)")
    g.add_argument("--load-shapes", nargs="+", choices=["64", "256"], default=None,
                   help="load shapes, by side (default: 64 and 256; smoke: 64)")
    g.add_argument("--load-seed", type=int, default=None, help="seed of the arrival schedules (default 20240613)")
    g.add_argument("--load-scale", type=float, default=1.0,
                   help="multiply every load window and group minimum by this (default 1; e.g. 3 for steadier figures)")

    f = p.add_argument_group("fleet benchmark")
    f.add_argument("--fleet-baseline", default=None, metavar="REV",
                   help="with --fleet: instead of the fleet run, the engine in process against this git revision's "
                        "engine, point by point side by side (fleet_baseline.*; e.g. 768553e)")
    f.add_argument("--fleet-baseline-events", type=int, default=None, metavar="N",
                   help="with --fleet-baseline: N timed events at every point for both engines (default: 300, "
                        "fewer for the earlier engine at deep queues, which an O(queue) engine needs)")

    d = p.add_argument_group("deadline benchmark")
    d.add_argument("--deadline-margin-quantile", type=margin_quantile, default=None,
                   help="the scheduler's --deadline-margin-quantile for the deadline benchmark (default: serve's own)")
    return p


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
