"""`candidate-scheduler bench --load`: the load benchmark (part of `make bench`).

Open-loop Poisson arrivals of candidate groups (counts mixed over 1, 2, 4, 8; 20 steps; 64x64 and
256x256) against three arms side by side in one run:

- `sglang_sequential`: sglang's own Cosmos3 pipeline, each candidate its own request, first come
  first served (`bench/sglang_fcfs.py`): what a user has today;
- `dispatch`: `serve --batching dispatch` + one cosmos3 worker (today's batching: a batch runs from its
  first to its last denoise step);
- `step`: `serve --batching step` + one cosmos3 worker (groups join and leave at step boundaries).

Per arm and shape: unloaded latency, capacity (the highest offered load whose p99 stays within 3x the
unloaded latency; a short bounded search), then 1.2x of that capacity and the point at 0.7x the
`dispatch` capacity. Per point: p50/p99 latency, goodput, time to first denoise step, rows per forward.
A few replies of every arm are checked bitwise against sglang's pipeline. Outputs in --out:
`load_<device>[_smoke].json`, `load_report.md`, `load_p99.png`.

An arm whose `serve` flags this `serve` does not accept is skipped with a note (and `dispatch` falls
back to no flag, since dispatch batching is all a `serve` without `--batching` has).
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from candidate_scheduler.bench.common import (
    DEFAULT_MODEL,
    DEFAULT_OUT,
    ensure_model,
    git_rev,
    loadavg,
    package_version,
)
from candidate_scheduler.bench.load_arms import start_arms
from candidate_scheduler.bench.load_plan import DEFAULT_ARMS, FULL, LOAD_SEED, SMOKE, parse_arm_flags, scaled
from candidate_scheduler.bench.load_report import build_result, summary, write_outputs
from candidate_scheduler.bench.load_shape import ShapeBench
from candidate_scheduler.service.launcher import Launcher


def options(args) -> dict:
    smoke = bool(getattr(args, "smoke", False))
    plan = SMOKE if smoke else FULL
    sides = getattr(args, "load_shapes", None)
    if sides:  # a side the plan lacks (256 in the smoke plan): the plan's first windows, the full plan's pool
        by_side = {s.side: s for s in plan.shapes}
        pools = {s.side: s.observation_pool for s in FULL.shapes}
        plan = replace(plan, shapes=tuple(
            by_side.get(int(x)) or replace(plan.shapes[0], side=int(x), observation_pool=pools.get(int(x), 0))
            for x in sides))
    plan = scaled(plan, float(getattr(args, "load_scale", None) or 1.0))
    return {
        "smoke": smoke,
        "plan": plan,
        "model": str(Path(getattr(args, "model", None) or DEFAULT_MODEL).expanduser().resolve()),
        "device": getattr(args, "device", "cpu") or "cpu",
        "out": Path(getattr(args, "out", None) or DEFAULT_OUT),
        "arms": list(getattr(args, "arms", None) or DEFAULT_ARMS),
        "arm_flags": parse_arm_flags(list(getattr(args, "arm_flags", None) or [])),
        "seed": int(getattr(args, "load_seed", None) or LOAD_SEED),
        "plots": not getattr(args, "no_plots", False),
    }


def _units(plan, n_arms: int) -> int:
    """Progress units: starting the arms, then per shape and arm warm-up, unloaded, the search probes,
    the sweep, the comparison point and parity."""
    return 1 + sum(n_arms * (2 + s.search_probes + len(s.sweep) + 2) for s in plan.shapes)


def run_load(opts: dict) -> dict:
    from tqdm import tqdm

    t_start = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    ensure_model(opts["model"])
    plan = opts["plan"]
    log_dir = Path(tempfile.mkdtemp(prefix="cs-load-"))
    launcher = Launcher(log_dir)
    progress = tqdm(total=_units(plan, len(opts["arms"])), desc="load: starting the arms", unit="point",
                    file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    load_before = loadavg()
    ok = False
    try:
        arms, skipped, reference = start_arms(launcher, opts["arms"], opts["arm_flags"], opts["model"], opts["device"],
                                              sides=tuple(s.side for s in plan.shapes))
        progress.update(1)
        start_s = time.perf_counter() - t_start
        progress.total = _units(plan, len(arms))
        shapes = []
        phases = {"start_s": start_s}
        for shape in plan.shapes:
            t0 = time.perf_counter()
            shapes.append(ShapeBench(shape, plan, arms, reference, progress, opts["seed"]).run())
            phases[f"{shape.name}_s"] = time.perf_counter() - t0
        progress.total = progress.n
        progress.set_description("load: done")
        notes = {name: list(notes) for name, notes in skipped.items()}
        for arm in arms.values():
            if arm.notes:
                notes.setdefault(arm.name, []).extend(arm.notes)
        meta = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "git": git_rev(),
            "smoke": opts["smoke"],
            "device": opts["device"],
            "cpu_count": os.cpu_count(),
            "sglang": package_version("sglang"),
            "model": opts["model"],
            "seed": opts["seed"],
            "arms": list(arms),
            "arms_requested": opts["arms"],
            "arm_flags": {name: list(arm.flags) for name, arm in arms.items() if arm.handle is not None},
            "notes": notes,
            "plan": {"shapes": [vars(s) for s in plan.shapes],
                     "search_resolution": plan.search_resolution, "parity_groups": plan.parity_groups},
            "phases": phases,
            "loadavg_start": load_before,
        }
        result = build_result(shapes, meta)
        meta["loadavg_end"] = loadavg()
        meta["wall_s"] = time.perf_counter() - t_start
        ok = True
        return result
    finally:
        progress.close()
        launcher.close(timeout_s=10)
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"\nload bench failed; child logs in {log_dir}", file=sys.stderr)


def main(args) -> int:
    opts = options(args)
    result = run_load(opts)
    files = write_outputs(result, opts["out"], opts["plots"])
    print(f"bench --load: {result['meta']['wall_s']:.0f} s; wrote {files['json']}, {files['report']}"
          + (f", {files['plot']}" if files["plot"] else ""))
    print(summary(result))
    return 0
