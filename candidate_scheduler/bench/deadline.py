"""The deadline benchmark (issue 14, item 6): fixed vs elastic candidate counts under deadlines, open loop.

One `serve --batching step` and one cosmos3 `worker --capacity 8` on the tiny checkpoint (64x64, 10
denoise steps, horizon 16). Every group asks for 8 candidates with a deadline of 3x the unloaded latency
of a count-8 group (the median of a few, run alone first). Two arms, run one after the other against
the same arrival schedules (same seeds, same times):

- fixed:   count 8, min_count 8 -- served in full or refused;
- elastic: count 8, min_count 2 -- the scheduler serves the first n in [2, 8] that meet the deadline.

The fixed arm's capacity is the highest Poisson rate at which <= 1% of its groups miss (a short
bisection, bench/deadline_capacity.py); the offered loads are 0.5x .. 2x of it. Per arm and load: the
deadline-miss rate (refused at receipt / expired / done late), goodput, mean served count, latency of
done groups, and the refusal round trip. A quality proxy (bench/deadline_quality.py) says what fewer
candidates cost: the RMSE of the n-candidate mean against a 64-candidate mean of the same seed stream.
Every done reply is checked against the first n candidates of the same seed's full group, bitwise.

    python -m candidate_scheduler.bench.deadline [--smoke] [--out DIR] [--model DIR]

Outputs (in --out, default bench/results/): deadline_<device>[_smoke].json, deadline_report[_smoke].md,
deadline_miss[_smoke].png, and with --smoke deadline_candidates_smoke.npz (every elastic done reply's
candidates and the references, for tests/integration/test_bench_deadline_smoke.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from candidate_scheduler.bench import deadline_settings
from candidate_scheduler.bench.common import (
    DEFAULT_MODEL,
    DEFAULT_OUT,
    PROMPT,
    ensure_model,
    git_rev,
    json_default,
    loadavg,
    package_version,
)
from candidate_scheduler.bench.deadline_capacity import search_capacity
from candidate_scheduler.bench.deadline_engine import DEPTHS, engine_timings
from candidate_scheduler.bench.deadline_outcomes import kind, latency_stats_ms, pooled_refusals
from candidate_scheduler.bench.deadline_parity import same_bits, streams_vs_references
from candidate_scheduler.bench.deadline_quality import candidate_streams, delivered, quality_table, reply_rmse
from candidate_scheduler.bench.deadline_settings import (
    ARMS,
    BASE_SEED,
    COUNT,
    DEADLINE_FACTOR,
    REDUCER,
    WORKER_CAPACITY,
    DeadlineSettings,
)
from candidate_scheduler.bench.deadline_sim import WORKERS, simulate, summarize_sim
from candidate_scheduler.bench.deadline_window import Target, run_window
from candidate_scheduler.bench.open_loop import at_rate, poisson_schedule, unit_schedule
from candidate_scheduler.core.engine import EngineConfig
from candidate_scheduler.service.launcher import Launcher

Progress = Callable[[str], None]


def printer(t0: float) -> Progress:
    def say(message: str) -> None:
        print(f"[deadline {time.perf_counter() - t0:6.1f} s] {message}", file=sys.stderr, flush=True)

    return say


def measure_unloaded(client, image: np.ndarray, settings: DeadlineSettings, say: Progress) -> dict:
    """Count-8 groups run alone, one at a time: the unloaded latency (median) and each seed's full group,
    the reference of every reply that follows. Also the elastic floor (count 2) alone, for context."""

    step_s: dict[int, list[float]] = {}
    overhead_s: list[float] = []

    def one(seed: int, count: int) -> tuple[float, object]:
        t = time.perf_counter()
        r = client.submit(image, PROMPT, count=count, seed=seed, reducer=REDUCER, return_candidates=True,
                          timeout_s=120, **settings.sampling)
        latency = time.perf_counter() - t
        if not r.ok:
            raise RuntimeError(f"an unloaded count-{count} group failed: {r.status}: {r.error_code}: {r.error}")
        step_s.setdefault(count, []).append(float(r.metrics.get("denoise_s", 0.0)) / settings.sampling["steps"])
        overhead_s.append(float(r.metrics.get("condition_s", 0.0)) + float(r.metrics.get("postprocess_s", 0.0)))
        return latency, r

    for _ in range(settings.warmup_groups):
        one(settings.seeds[0], COUNT)
    latencies, references, repeatable = [], {}, True
    for _ in range(settings.unloaded_rounds):
        for seed in settings.seeds:
            latency, r = one(seed, COUNT)
            latencies.append(latency)
            cands = np.asarray(r.candidates, dtype=np.float32)
            if seed in references:
                repeatable = repeatable and same_bits(cands, references[seed])
            else:
                references[seed] = cands
    floor = [one(seed, ARMS["elastic"]["min_count"])[0] for seed in settings.seeds]
    median = float(np.median(latencies))
    say(f"unloaded count-{COUNT} latency: median {median * 1000:.1f} ms over {len(latencies)} groups "
        f"(count-{ARMS['elastic']['min_count']}: {np.median(floor) * 1000:.1f} ms)")
    return {"latencies_ms": [x * 1000 for x in latencies], "median_s": median,
            "min_count_latencies_ms": [x * 1000 for x in floor], "min_count_median_s": float(np.median(floor)),
            "step_s": {n: float(np.median(v)) for n, v in step_s.items()}, "overhead_s": float(np.median(overhead_s)),
            "references_repeatable": repeatable, "references": references}


def fixed_crossover(cap: float, deadline_s: float, unloaded: dict, settings: DeadlineSettings) -> dict | None:
    """In simulated time (fluid worker): the lowest load, in capacities, at which the fixed arm misses
    more than half its groups, and what the elastic arm misses there (fluid and stepping workers)."""
    def run(arm: str, rate: float, worker: str) -> dict:
        arrivals = poisson_schedule(rate, settings.sim_window_s, BASE_SEED + 999)
        return summarize_sim(simulate(arrivals, ARMS[arm]["min_count"], deadline_s, unloaded["step_s"],
                                      settings.sampling, overhead_s=unloaded["overhead_s"], count=COUNT,
                                      worker=worker), deadline_s)

    for factor in np.arange(2.5, 8.01, 0.5):  # 2x and below are run for real
        fixed = run("fixed", factor * cap, "fluid")
        if fixed["miss_rate"] > 0.5:
            return {"factor": float(factor), "rate": float(factor * cap), "fixed": fixed,
                    "elastic": {w: run("elastic", factor * cap, w) for w in WORKERS}}
    return None


def _line(arm: str, rate: float, s: dict) -> str:
    lat = s["done_latency"]
    served = "-" if s["mean_served_count"] is None else f"{s['mean_served_count']:.2f}"
    p99 = "-" if lat["p99_ms"] is None else f"{lat['p99_ms']:.0f}"
    return (f"{arm:>7} @ {rate:5.2f}/s: {s['groups']:3d} groups, miss {s['misses']:3d} "
            f"(refused {s['refused']}, expired {s['expired']}, late {s['done_late']}, other {s['other']}), "
            f"served {served}, p99 {p99} ms")


def _in_time_histogram(outcomes, deadline_s: float) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        if kind(o, deadline_s) == "in_time" and o.served_count is not None:
            counts[str(o.served_count)] = counts.get(str(o.served_count), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def run_deadline_bench(out_dir: Path, model: str | Path = DEFAULT_MODEL, smoke: bool = False,
                       progress: Progress | None = None, plot: bool = True, device: str = "cpu",
                       margin_quantile: float | None = None) -> dict:
    """Run the deadline benchmark and write its outputs under `out_dir`; returns the result dict.
    `progress(message)` is called at every phase and window (default: a line on stderr)."""
    from candidate_scheduler.service.client import synthetic_image

    t0 = time.perf_counter()
    say = progress or printer(t0)
    settings = deadline_settings.smoke() if smoke else deadline_settings.full()
    model = str(Path(model).expanduser().resolve())
    out_dir = Path(out_dir)
    for key, value in (("HF_HUB_OFFLINE", "1"), ("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    ensure_model(model)
    image = synthetic_image(settings.sampling["height"], settings.sampling["width"], seed=0)
    log_dir = Path(tempfile.mkdtemp(prefix="cs-deadline-"))
    launcher = Launcher(log_dir)
    load_before = loadavg()
    phases: dict[str, float] = {}
    ok = False
    try:
        say(f"{'smoke' if smoke else 'full'} run: starting serve --batching step + worker cosmos3 "
            f"--capacity {WORKER_CAPACITY}")
        serve_flags = ("--batching", "step")
        if margin_quantile is not None:
            serve_flags += ("--deadline-margin-quantile", str(margin_quantile))
        handle = launcher.scheduler(*serve_flags, metrics=True, name="deadline-scheduler")
        launcher.worker(handle, "cosmos3", WORKER_CAPACITY, model=model, device=device)
        say(f"quality proxy: {len(settings.seeds)} seed streams x 64 candidates in process "
            "(the worker loads meanwhile)")
        streams, quality_run = candidate_streams(model, list(settings.seeds), settings.sampling, image, device=device)
        quality = quality_table(streams, COUNT)
        quality["run"] = quality_run
        handle.wait_workers(1, timeout_s=300, poll_s=0.2)
        phases["start_s"] = time.perf_counter() - t0
        control = handle.client()
        try:
            unloaded = measure_unloaded(control, image, settings, say)
            references = unloaded.pop("references")
            quality["streams_vs_service"] = streams_vs_references(streams, references)
            deadline_s = DEADLINE_FACTOR * unloaded["median_s"]
            target = Target(handle.request, control, handle.metrics, image, settings, deadline_s, references)
            say(f"deadline {deadline_s * 1000:.0f} ms for every group")
            phases["unloaded_s"] = time.perf_counter() - t0 - phases["start_s"]

            t_cap = time.perf_counter()
            mu = 1.0 / unloaded["median_s"]
            unit = unit_schedule(int(mu * settings.probe_window_s * 2 + 50), BASE_SEED)

            def probe(rate: float) -> dict:
                summary, _, _ = run_window(target, "fixed", at_rate(unit, rate, settings.probe_window_s),
                                           settings.probe_window_s)
                say("capacity probe " + _line("fixed", rate, summary))
                return summary

            capacity = search_capacity(probe, mu, settings.capacity_iterations)
            cap = capacity["capacity"]
            say(f"fixed-arm capacity: {cap:.2f} groups/s ({cap / mu:.3f} of mu = {mu:.2f}/s)"
                + ("" if capacity["found"] else " -- no probe passed; an upper bound"))
            phases["capacity_s"] = time.perf_counter() - t_cap

            t_loads = time.perf_counter()
            loads, arms = [], {arm: [] for arm in ARMS}
            all_outcomes: dict[str, list] = {arm: [] for arm in ARMS}
            all_pings: list[float] = []
            for li, factor in enumerate(settings.factors):
                rate, window = factor * cap, settings.window_of(factor)
                schedule_seed = BASE_SEED + 100 + li
                times = poisson_schedule(rate, window, schedule_seed)
                loads.append({"factor": factor, "rate": rate, "window_s": window, "groups": len(times),
                              "schedule_seed": schedule_seed})
                # alternate which arm goes first, so neither always runs on a machine the other warmed
                for arm in (list(ARMS) if li % 2 == 0 else list(reversed(ARMS))):
                    summary, outcomes, pings = run_window(target, arm, times, window)
                    all_pings += pings
                    hist = _in_time_histogram(outcomes, deadline_s)
                    summary.update(factor=factor, offered_rate=rate, in_time_served_histogram=hist,
                                   quality_rmse_table_weighted=delivered(quality, hist),
                                   quality_rmse_replies=reply_rmse(outcomes, streams, deadline_s))
                    arms[arm].append(summary)
                    all_outcomes[arm].extend(outcomes)
                    say(f"load {factor:.2f}x " + _line(arm, rate, summary))
            for arm in arms:
                arms[arm].sort(key=lambda s: s["factor"])
            phases["loads_s"] = time.perf_counter() - t_loads
        finally:
            control.close()
        say(f"the same loads in simulated time ({settings.sim_window_s:.0f} s each), the real engine against a "
            "fluid worker (the forecast's own model) and a noise-free stepping one")
        for arm, rows in arms.items():
            for summary in rows:
                load = next(x for x in loads if x["factor"] == summary["factor"])
                arrivals = poisson_schedule(load["rate"], settings.sim_window_s, load["schedule_seed"])
                summary["simulated"] = {
                    worker: summarize_sim(simulate(arrivals, ARMS[arm]["min_count"], deadline_s, unloaded["step_s"],
                                                   settings.sampling, overhead_s=unloaded["overhead_s"], count=COUNT,
                                                   worker=worker), deadline_s)
                    for worker in WORKERS}
        crossover = fixed_crossover(cap, deadline_s, unloaded, settings)
        say("the deadline decisions' own cost, in process (an engine with the measured step times)")
        decisions = engine_timings(unloaded["step_s"], settings.sampling, deadline_s,
                                   depths=(1, 16) if smoke else DEPTHS, repeats=10 if smoke else 50)
        refusals = {arm: pooled_refusals(all_outcomes[arm]) for arm in ARMS}
        refusals["all"] = pooled_refusals([o for arm in ARMS for o in all_outcomes[arm]])
        refusals["ping_baseline"] = latency_stats_ms(all_pings)
        wall = time.perf_counter() - t0
        result = {
            "meta": {
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "git": git_rev(), "smoke": smoke, "model": model, "device": device, "prompt": PROMPT, "cpu_count": os.cpu_count(),
                "sglang": package_version("sglang"), "torch": package_version("torch"),
                "loadavg_start": load_before, "loadavg_end": loadavg(), "wall_s": wall, "phases": phases,
            },
            "settings": {**settings.to_dict(), "margin_quantile": margin_quantile if margin_quantile is not None
                         else EngineConfig().margin_quantile},
            "unloaded": unloaded,
            "deadline_s": deadline_s,
            "capacity": capacity,
            "loads": loads,
            "arms": arms,
            "refusals": refusals,
            "engine_decisions": decisions,
            "fixed_crossover": crossover,
            "quality": quality,
        }
        from candidate_scheduler.bench.deadline_report import targets, write_outputs

        result["targets"] = targets(result)
        files = write_outputs(result, out_dir, plot=plot)
        if smoke:
            files["candidates"] = str(_write_candidates(out_dir, all_outcomes["elastic"], references))
        result["files"] = files
        ok = True
        say(f"done in {wall:.0f} s; wrote " + ", ".join(str(v) for v in files.values() if isinstance(v, str)))
        return result
    finally:
        launcher.close(timeout_s=10)
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"deadline bench failed; child logs in {log_dir}", file=sys.stderr)


def _write_candidates(out_dir: Path, outcomes, references: dict[int, np.ndarray]) -> Path:
    """Every elastic done reply's candidates, seed and served count, and each seed's full count-8 group
    run alone: what the smoke test checks, independently of the benchmark's own check."""
    arrays: dict[str, np.ndarray] = {f"reference_{seed}": ref for seed, ref in references.items()}
    done = [o for o in outcomes if o.status == "done" and o.candidates is not None]
    for k, o in enumerate(done):
        arrays[f"reply_{k}"] = np.asarray(o.candidates, dtype=np.float32)
    arrays["reply_seeds"] = np.asarray([o.seed for o in done], dtype=np.int64)
    arrays["reply_served_counts"] = np.asarray([o.served_count for o in done], dtype=np.int64)
    arrays["reply_candidate_seeds"] = np.asarray(
        [list(o.candidate_seeds) + [-1] * (COUNT - len(o.candidate_seeds)) for o in done], dtype=np.int64,
    ).reshape(len(done), COUNT)
    path = out_dir / "deadline_candidates_smoke.npz"
    np.savez(path, **arrays)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.bench.deadline", description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="a short run for CI (~1 minute, 2 load points)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default bench/results)")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="Cosmos3 checkpoint directory (default: the tiny one)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plot")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_deadline_bench(Path(args.out), args.model, smoke=args.smoke, plot=not args.no_plots)
    for t in result["targets"]:
        print(f"{'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['measured_text']}")
    print(json.dumps({"wall_s": round(result["meta"]["wall_s"], 1), "files": result["files"]}, default=json_default))
    return 0


if __name__ == "__main__":
    sys.exit(main())
