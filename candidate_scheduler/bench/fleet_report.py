"""The fleet benchmark's outputs: `fleet.json`, `fleet_report.md` and four plots (utilisation against
the number of workers; the engine's time per event against queue depth; against the number of workers,
and against it again under the scheduler's defaults on a simulated clock)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from candidate_scheduler.bench.common import fmt

MODES = ("dispatch", "step")
ELASTIC_TITLE = ("Every group elastic: 8 candidates, at least 2, with a deadline (refusal at receipt, and the "
                 "count chosen at every pass)")
NICED = "burst_workers_niced"  # the diagnostic workload (bench/fleet.py)
WORKERS_NICE = 10  # its workers' nice value: they yield the cores to the scheduler and the client


def _engine_name(revision: str | None, baseline: str | None) -> str:
    return f"before ({baseline})" if revision == "baseline" else "this revision"


def _extremes(rows: list[dict], axis: str) -> list[tuple[str, str, dict, dict]]:
    """(revision, mode, the row at the smallest `axis` value, the row at the largest) per series."""
    out = []
    for revision in ("current", "baseline"):
        for mode in MODES:
            by = {r[axis]: r for r in rows if r["batching"] == mode and r.get("revision", "current") == revision}
            if by:
                out.append((revision, mode, by[min(by)], by[max(by)]))
    return out


def _engine_table(rows: list[dict], title: str, baseline: str | None = None) -> list[str]:
    out = [f"#### {title}", "", "| engine | mode | queued | events | event p50 ms | event mean ms | submit us | groups/s |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {_engine_name(r.get('revision'), baseline)} | {r['batching']} | {r['depth']:,} | {r['events']} | "
                   f"{fmt(r['event_ms']['median'], 3)} | {fmt(r['event_mean_ms'], 3)} | {fmt(r['submit_us'], 0)} | "
                   f"{fmt(r['groups_per_s'], 0)} |")
    for revision, mode, lo, hi in _extremes(rows, "depth"):
        ratio = hi["event_mean_ms"] / lo["event_mean_ms"] if lo["event_mean_ms"] else None
        out.append(f"\n{_engine_name(revision, baseline)}, {mode}: time per event at {hi['depth']:,} queued is "
                   f"{fmt(ratio, 2)}x its time at {lo['depth']:,} (target <= 1.5x).")
    return out + [""]


SIZES_TITLE = ("Against the fleet's size: every group with a deadline, 1,000 queued (a refusal check at each "
               "submission, a planning pass after it and at each event)")


def _sizes_table(rows: list[dict], baseline: str | None = None) -> list[str]:
    out = [f"#### {SIZES_TITLE}", "", "| engine | mode | workers | events | event mean ms | submit us | groups/s |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {_engine_name(r.get('revision'), baseline)} | {r['batching']} | {r['workers']} | {r['events']} | "
                   f"{fmt(r['event_mean_ms'], 3)} | {fmt(r['submit_us'], 0)} | {fmt(r['groups_per_s'], 0)} |")
    return out + _size_ratios(rows, baseline, ("submit_us", "a submission"), ("event_mean_ms", "an event"))


def _size_ratios(rows: list[dict], baseline: str | None, first: tuple[str, str], second: tuple[str, str]) -> list[str]:
    """Per series, what two measures cost at the largest fleet over the smallest, in one sentence."""
    out = []
    for revision, mode, lo, hi in _extremes(rows, "workers"):
        if hi is not lo:
            out.append(f"\n{_engine_name(revision, baseline)}, {mode}: at {hi['workers']} workers {first[1]} costs "
                       f"{fmt(hi[first[0]] / lo[first[0]], 2)}x and {second[1]} "
                       f"{fmt(hi[second[0]] / lo[second[0]], 2)}x what they cost at {lo['workers']}.")
    return out + [""]


DEFAULTS_TITLE = ("Against the fleet's size under the scheduler's defaults: late prefetch and staggered starts, "
                  "on a simulated clock (bench/fleet_sim.py; best effort, a backlog of ten fleet batches)")


def _defaults_table(rows: list[dict], baseline: str | None = None) -> list[str]:
    out = [f"#### {DEFAULTS_TITLE}", "",
           "| engine | mode | workers | engine us per group | submit us | result event p50 us | wake-up p50 us | "
           "longest event ms | wake-ups per result | staggered starts | simulated utilisation | answered / ideal | "
           "loop busy |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {_engine_name(r.get('revision'), baseline)} | {r['batching']} | {r['workers']} | "
                   f"{fmt(r['engine_us_per_group'], 0)} | {fmt(r['submit_us'], 0)} | {fmt(r['result_us']['median'], 0)} | "
                   f"{fmt(r['wake_us']['median'], 0)} | {fmt(_longest_event_ms(r), 1)} | {fmt(r['wakes_per_result'], 2)} | "
                   f"{r['staggered_starts']} | {fmt(r['utilisation'], 2)} | {fmt(r.get('answered_over_ideal'), 3)} | "
                   f"{fmt(r.get('loop_busy'), 3)} |")
    charged = any(r.get("charged") for r in rows)
    return out + _size_ratios(rows, baseline, ("engine_us_per_group", "a group"), ("submit_us", "a submission")) + [
        "The longest event is the longest the scheduler's loop would answer nothing else: a result or a "
        "wake-up that places a whole synchronised wave (every worker due at once) places all of it. "
        + ("The engine's time was charged to the simulated clock (one loop thread on this machine): "
           "answered / ideal is how much of the fleet's throughput with every row busy it kept, and loop busy "
           "the share of the time its calls took." if charged else
           "The engine's time was not charged to the simulated clock: the utilisation shows the fleet was "
           "kept busy in simulated time only."), ""]


SPACING_TITLE = ("One group of 8 candidates at a time, spaced apart: its submission (no planning pass), the "
                 "planning pass that sends it, its result (bench/engine_spacing.py)")


def _spacing_table(rows: list[dict]) -> list[str]:
    out = [f"#### {SPACING_TITLE}", "", "| spacing ms | between groups | submit us | plan us | result us | "
           "all three us (median) | over back to back |", "|---:|---|---:|---:|---:|---:|---:|"]
    first = rows[0]["total_us"] if rows else None
    for r in rows:
        out.append(f"| {r['spacing_ms']:g} | {'spinning' if r['wait'] == 'spin' else 'asleep'} | {r['submit_us']:.0f} | "
                   f"{r['plan_us']:.0f} | {r['result_us']:.0f} | {r['total_us']:.0f} | "
                   f"{fmt(r['total_us'] / first if first else None, 2)}x |")
    return out + ["", "Spinning keeps the core busy, so a slowdown with the spacing is not a core waking from "
                  "idle. It grows with the pause, as it would if a group's code and data were leaving the caches "
                  "that the machine's other processes share meanwhile (not measured directly here).", ""]


def _longest_event_ms(point: dict) -> float | None:
    """The longest engine call of a simulated-fleet point (a result or a wake-up), in ms."""
    longest = [s["max"] for s in (point["result_us"], point["wake_us"]) if s.get("max") is not None]
    return max(longest) / 1e3 if longest else None


def _fleet_table(runs: list[dict]) -> list[str]:
    out = ["| K | step ms | mode | workload | groups | done/s | ideal/s | utilisation | receipt->reply p50 / p99 ms | "
           "client p50 / p99 ms | CPU cores: scheduler / workers / client | waited for a core: scheduler / "
           "workers / client | machine busy | checks |",
           "|---:|---:|---|---|---:|---:|---:|---:|---|---|---|---|---:|---|"]
    for r in runs:
        c, rr, cl = r["cores"], r["receipt_to_reply_ms"], r["client_latency_ms"]
        w = r.get("waited") or {}
        waited = " / ".join("-" if w.get(k) is None else f"{w[k]:.2f}" for k in ("scheduler", "workers", "client"))
        check = r["check"]
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(check["statuses"].items()))
        ok = "ok" if check["replies"] == check["groups"] and check["wrong_results"] == 0 else "FAILED"
        if r["workload"].get("min_count") is not None and check.get("served_mean") is not None:
            statuses += f"; served {check['served_mean']:.1f} of {max(r['workload']['counts'])} on average"
        out.append(
            f"| {r['workers']} | {r['step_s'] * 1e3:.0f} | {r['batching']} | {r['workload']['name']} | "
            f"{r['workload']['groups']:,} | {r['groups_per_s']:.0f} | {r['ideal_groups_per_s']:.0f} | "
            f"{r['utilisation']:.2f} | {fmt(rr['p50'], 0)} / {fmt(rr['p99'], 0)} | {fmt(cl['p50'], 0)} / "
            f"{fmt(cl['p99'], 0)} | {c['scheduler']:.2f} / {c['workers']:.2f} / {c['client']:.2f} | {waited} | "
            f"{fmt(r['machine_busy'], 2)} | {ok}: {statuses} |")
    return out


def cpu_us_per_group(run: dict, process: str) -> float | None:
    """A process class's CPU seconds per group answered `done`, in microseconds (None: none done)."""
    done = run["groups_per_s"] * run["wall_s"]
    return run["cores"][process] * run["wall_s"] / done * 1e6 if done else None


def _cpu_budget(runs: list[dict], cores: int) -> list[str]:
    """Per burst run: each process class's CPU per group answered, and the rate the machine's cores would
    allow if every one of them did nothing else (the ceiling a 2-core machine puts on the figure)."""
    out = ["| K | mode | workload | scheduler us/group | workers us/group | client us/group | ceiling groups/s "
           "(cores / CPU per group) | scheduler's ceiling (one core) | measured groups/s |",
           "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        if r["workload"]["name"] not in ("burst", NICED):
            continue
        per = {k: cpu_us_per_group(r, k) or 0.0 for k in r["cores"]}
        total = sum(per.values())
        sched = per.get("scheduler", 0)
        out.append(f"| {r['workers']} | {r['batching']} | {r['workload']['name']} | {sched:.0f} | "
                   f"{per.get('workers', 0):.0f} | {per.get('client', 0):.0f} | "
                   f"{cores / total * 1e6 if total else 0:.0f} | {1e6 / sched if sched else 0:.0f} | "
                   f"{r['groups_per_s']:.0f} |")
    return out


def _factors(runs: list[dict]) -> list[str]:
    """Per run with the workers' step records: the utilisation as the product of its three factors
    (bench/fleet_steps.py), beside the workers' wait for a core that a late step comes from."""
    out = ["| K | mode | workload | utilisation | fullness | step accuracy (mean step ms) | stepping | product | "
           "accounted | workers waited for a core |",
           "|---:|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in runs:
        f = r.get("steps") or {}
        if "fullness" not in f:
            continue
        product = f["fullness"] * f["step_accuracy"] * f["stepping"]
        waited = (r.get("waited") or {}).get("workers")
        out.append(f"| {r['workers']} | {r['batching']} | {r['workload']['name']} | {r['utilisation']:.3f} | "
                   f"{f['fullness']:.3f} | {f['step_accuracy']:.3f} ({f['mean_step_ms']:.2f}) | {f['stepping']:.3f} | "
                   f"{product:.3f} | {fmt(f['accounted'], 3)} | {'-' if waited is None else f'{waited:.2f}'} |")
    return out


def _whole_batches(run: dict, rows: int) -> str:
    """Under dispatch batching a burst of one-candidate groups is groups / capacity batches of one batch
    time each, dealt to K workers: the last round may leave some idle, which caps the utilisation."""
    groups, workers = run["workload"]["groups"], run["workers"]
    rounds = math.ceil(groups / rows / workers)
    return (f"; whole batches allow at most {groups / rows / workers / rounds:.3f} ({groups:,} groups are "
            f"{math.ceil(groups / rows):,} batches, {rounds} rounds of {workers} workers)")


def _targets(runs: list[dict], capacity: int) -> list[str]:
    def pick(k: int, mode: str) -> dict | None:
        return next((r for r in runs if r["workers"] == k and r["batching"] == mode
                     and r["workload"]["name"] == "burst"), None)

    out = []
    for k, target in ((16, 0.9), (32, 0.8)):
        for mode in MODES:
            r = pick(k, mode)
            if r is not None:
                out.append(f"- K={k}, {mode}, burst of {r['workload']['groups']:,}: utilisation {r['utilisation']:.3f} "
                           f"(target >= {target}){_whole_batches(r, capacity) if mode == 'dispatch' else ''}.")
        d, s = pick(k, "dispatch"), pick(k, "step")
        if d and s:
            out.append(f"- K={k}: step/dispatch groups/s {s['groups_per_s'] / d['groups_per_s']:.2f} (target >= 0.9).")
    return out


def write_outputs(result: dict, out_dir: Path, plot: bool = True) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "fleet.json"
    json_path.write_text(json.dumps(result, indent=1, default=float) + "\n")
    meta = result["meta"]
    lines = [
        "# Fleet benchmark: the scheduler against K emulated GPU workers",
        "",
        f"{meta['created']}, git {meta['git']}, {meta['cpu_count']} CPU cores, load average {meta['loadavg_start']} "
        f"-> {meta['loadavg_end']}; {meta['wall_s']:.0f} s. Written by `candidate-scheduler bench --fleet`"
        f"{' --smoke' if meta['smoke'] else ''} (bench/fleet.py, bench/fleet_engine.py).",
        "",
        "## The engine alone, in process (no IO)",
        "",
        f"{meta['engine_workers']} fake workers of {meta['engine_rows']} rows, one-candidate groups, the queue held "
        "at a fixed depth; an event is one worker result (fold, reduce, answer, plan). The workers register "
        "with a warm-up profile, so the deadline code runs as in production.",
        "",
    ]
    lines += _engine_table(result["engine"], "Without deadlines")
    if result.get("engine_deadlines"):
        lines += _engine_table(result["engine_deadlines"], "Every group with a deadline (refusal at receipt on each)")
    if result.get("engine_elastic"):
        lines += _engine_table(result["engine_elastic"], ELASTIC_TITLE)
    if result.get("engine_sizes"):
        lines += _sizes_table(result["engine_sizes"])
    if result.get("engine_defaults"):
        lines += _defaults_table(result["engine_defaults"])
    if result.get("engine_spacing"):
        lines += _spacing_table(result["engine_spacing"])
    lines += [
        "## The scheduler over ZMQ against K null workers",
        "",
        f"Null workers: capacity {result['fleet']['capacity']} rows, {result['fleet']['steps']} steps, a step is a "
        f"sleep of the step time; {result['fleet']['side']}x{result['fleet']['side']} observations. Utilisation: "
        "the time the workers would need if every batch were full, over the wall time from the first send to the "
        "last reply. CPU cores: each process class's CPU seconds over that wall time (the machine has "
        f"{meta['cpu_count']}). Waited for a core: the seconds each class's threads were ready to run but "
        "waited for a core (the kernel's run-queue delay), over that wall time. Checks: one reply per group, "
        "every `done` action the null model's answer for its seeds.",
        "",
        f"`{NICED}` is `burst` again with every worker thread at nice {WORKERS_NICE}: on this machine the "
        "workers share the scheduler's two cores, which GPU workers on other hosts would not; at a lower "
        "priority they yield those cores to the scheduler and the client. It shows how much of the shortfall "
        "is that sharing. It is a diagnostic, never a target figure.",
        "",
    ]
    lines += _fleet_table(result["fleet"]["runs"])
    lines += [f"\n{r['workload']['name']} at K={r['workers']} ({r['batching']}): skipped, {r['skipped']}."
              for r in result["fleet"].get("skipped", ())]
    lines += ["", "### Targets", ""] + _targets(result["fleet"]["runs"], result["fleet"]["capacity"])
    lines += ["", "### Where the utilisation goes", "",
              "From the workers' own step records (their heartbeats, counted by the scheduler's `forward_rows` "
              "and `forward_seconds`): utilisation = fullness (candidate rows per step over the capacity: the "
              "batches the scheduler formed) x step accuracy (the declared step time over the measured one: "
              "a null worker's sleep that ends late: its thread waited for a core or the interpreter lock) x stepping (the "
              "workers' step seconds over K x the wall time: the time they stepped rather than waited for work, "
              "answered or started it). Product: the three multiplied, equal to the utilisation when every "
              "step record of the run arrived (accounted: 1.000). Workers waited for a core: as in the table "
              "above, all K workers' threads together, seconds per second.", ""]
    lines += _factors(result["fleet"]["runs"])
    lines += ["", "### Where the CPU goes (burst runs)", "",
              "Every process of the benchmark shares this machine's cores: the scheduler, the K workers (a null "
              "worker's own CPU stands in for nothing a GPU worker would not also spend on the host: decoding, "
              "threads, its answer) and the client. The ceiling is the rate at which the cores, doing nothing "
              "else, would run every process's CPU per group; the scheduler's ceiling is one core running the "
              "scheduler's CPU per group alone (its loop is one thread: it cannot use the second core).", ""]
    lines += _cpu_budget(result["fleet"]["runs"], meta["cpu_count"])
    plots = _plots(result, out_dir) if plot else []
    lines += [""] + [f"![{name}]({name})" for name in plots]
    report = out_dir / "fleet_report.md"
    report.write_text("\n".join(lines) + "\n")
    return {"json": str(json_path), "report": str(report), "plots": plots}


def write_baseline(result: dict, out_dir: Path, plot: bool = True) -> dict:
    """fleet_baseline.json / .md / .png: the engine in process, an earlier revision's beside this one's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = result["meta"]
    json_path = out_dir / "fleet_baseline.json"
    json_path.write_text(json.dumps(result, indent=1, default=float) + "\n")
    lines = ["# The engine in process, before and after: each point against both revisions, side by side", "",
             f"{meta['created']}, this revision git {meta['git']}, before: {meta['baseline']}; {meta['cpu_count']} "
             f"CPU cores, load average {meta['loadavg_start']} -> {meta['loadavg_end']}; {meta['wall_s']:.0f} s. "
             f"Written by `candidate-scheduler bench --fleet --fleet-baseline {meta['baseline']}` "
             "(bench/fleet_engine.py, each point in a fresh process; the earlier revision's right before this one's).",
             "", f"{meta['engine_workers']} fake workers of {meta['engine_rows']} rows, one-candidate groups, the queue "
             "held at a fixed depth; an event is one worker result (fold, reduce, answer, plan)."
             + ("" if meta.get("same_events") else " Fewer events at the earlier engine's deep points keep each "
                "within about a minute."), ""]
    lines += _engine_table(result["engine"], "Without deadlines", meta["baseline"])
    if result.get("engine_deadlines"):
        lines += _engine_table(result["engine_deadlines"], "Every group with a deadline (refusal at receipt on each)",
                               meta["baseline"])
    if result.get("engine_elastic"):
        lines += _engine_table(result["engine_elastic"], ELASTIC_TITLE, meta["baseline"])
    if result.get("engine_sizes"):
        lines += _sizes_table(result["engine_sizes"], meta["baseline"])
    if result.get("engine_defaults"):
        lines += _defaults_table(result["engine_defaults"], meta["baseline"])
    plots = []
    if plot:
        plots = [_engine_plot({"meta": meta, "engine": result["engine"]}, out_dir, "fleet_baseline.png")]
        if result.get("engine_sizes"):
            plots.append(_sizes_plot(result, out_dir, "fleet_baseline_sizes.png"))
        if result.get("engine_defaults"):
            plots.append(_sizes_plot(result, out_dir, "fleet_baseline_defaults.png", "engine_defaults",
                                     DEFAULTS_PANELS, DEFAULTS_PLOT_TITLE))
    lines += [f"![{name}]({name})" for name in plots]
    report = out_dir / "fleet_baseline.md"
    report.write_text("\n".join(lines) + "\n")
    return {"json": str(json_path), "report": str(report), "plots": plots}


def _plots(result: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    runs = [r for r in result["fleet"]["runs"] if r["workload"]["name"] == "burst"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for mode, color in zip(MODES, ("#0072b2", "#009e73")):
        pts = sorted((r["workers"], r["utilisation"]) for r in runs if r["batching"] == mode)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=mode)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("null workers K (10 ms steps; 20 ms at K=32)")
    ax.set_ylabel("utilisation")
    ax.set_title("Fleet utilisation, burst of one-candidate groups")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "fleet_utilisation.png")
    plt.close(fig)
    names.append("fleet_utilisation.png")

    names.append(_engine_plot(result, out_dir, "fleet_engine.png"))
    if result.get("engine_sizes"):
        names.append(_sizes_plot(result, out_dir, "fleet_engine_sizes.png"))
    if result.get("engine_defaults"):
        names.append(_sizes_plot(result, out_dir, "fleet_engine_defaults.png", "engine_defaults", DEFAULTS_PANELS,
                                 DEFAULTS_PLOT_TITLE))
    return names


SIZES_PANELS = (("submit_us", "engine time per submission, us"),
                ("event_mean_ms", "engine time per result event, ms (mean)"))
SIZES_PLOT_TITLE = "Engine cost against the fleet's size (deadline groups, 1,000 queued, in process)"
DEFAULTS_PANELS = (("submit_us", "engine time per submission, us"),
                   ("engine_us_per_group", "engine time per group answered, us (all calls)"))
DEFAULTS_PLOT_TITLE = "Engine cost against the fleet's size under the defaults (simulated clock, in process)"


def _sizes_plot(result: dict, out_dir: Path, name: str, key: str = "engine_sizes", panels=SIZES_PANELS,
                title: str = SIZES_PLOT_TITLE) -> str:
    """Engine times against the number of workers, one panel per measure, both revisions when two."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baseline = result["meta"].get("baseline")
    fig, axes = plt.subplots(1, len(panels), figsize=(10, 4.2), dpi=100)
    for ax, (measure, label) in zip(axes, panels):
        for revision, style, suffix in (("current", "-", ""), ("baseline", ":", f" before ({baseline})")):
            for mode, color in zip(MODES, ("#0072b2", "#009e73")):
                pts = sorted((r["workers"], r[measure]) for r in result[key]
                             if r["batching"] == mode and r.get("revision", "current") == revision)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=color,
                            label=f"{mode}{suffix}")
        ax.set_xscale("log", base=2)
        sizes = sorted({r["workers"] for r in result[key]})
        ax.set_xticks(sizes, [str(k) for k in sizes])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("fake workers (8 rows each)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_dir / name)
    plt.close(fig)
    return name


def _engine_plot(result: dict, out_dir: Path, name: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    baseline = result["meta"].get("baseline")
    curves = [("engine", "current", "-", ""), ("engine_deadlines", "current", "--", " (deadlines)"),
              ("engine_elastic", "current", "-.", " (elastic)"),
              ("engine", "baseline", ":", f" before ({baseline})")]
    for key, revision, style, suffix in curves:
        for mode, color in zip(MODES, ("#0072b2", "#009e73")):
            pts = sorted((r["depth"], r["event_mean_ms"]) for r in result.get(key) or ()
                         if r["batching"] == mode and r.get("revision", "current") == revision)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=color,
                        label=f"{mode}{suffix}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("queued groups")
    ax.set_ylabel("engine time per result event, ms (mean)")
    ax.set_title("Engine cost against queue depth (in process)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / name)
    plt.close(fig)
    return name
