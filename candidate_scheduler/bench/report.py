"""The method benchmark's outputs: `report.md` (tables and targets), the JSON of every sample, and a
one-line-per-target summary for the terminal."""

from __future__ import annotations

import json
from pathlib import Path

from candidate_scheduler.bench.common import fmt, json_default
from candidate_scheduler.bench.plots import write_plots
from candidate_scheduler.bench.settings import LABELS, METHODS, TARGET_N
from candidate_scheduler.bench.targets import speedup_ceiling


def _mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def write_report(result: dict, out_dir: Path, json_name: str, plots: list[str]) -> Path:
    meta = result["meta"]
    lines = [
        f"# candidate_scheduler benchmark{' (smoke)' if meta['smoke'] else ''}",
        "",
        f"{meta['created']} · git {meta['git']} · device `{meta['device']}` ({meta['device_name']}, "
        f"{meta['cpu_count']} CPUs, torch {meta['torch']} with {meta['torch_threads']} threads) · sglang "
        f"{meta['sglang']} · model `{Path(meta['model']).name}` · repeats {meta['repeats']} · "
        f"wall {meta.get('wall_s', 0):.0f} s · load average (1/5/15 min) {meta.get('loadavg_start')} at start, "
        f"{meta.get('loadavg_end')} at end. Raw samples: [`{json_name}`]({json_name}).",
        "",
        "Methods, interleaved per repeat (the order rotates): **(a)** N calls of sglang's own Cosmos3 pipeline "
        "with the candidates' seeds; **(b)** sglang's own observation batching (one request, N copies of the "
        "image; one generator for all noise, so its candidates match no seed); **(c)** our worker's batched "
        "group in process (`adapter.run_batch`); **(d)** end to end: client -> ZMQ -> scheduler -> worker "
        "process -> reply. Every method includes the `mean` reduction to one action. Latency: median and p90 "
        "over repeats; speedups are ratios of medians.",
        "",
        "## Targets (small shape 64x64, 4 steps, N=8)",
        "",
        "| target | measured | result |",
        "|---|---|---|",
    ]
    for t in result["targets"]:
        unit = t["unit"]
        measured = f"{fmt(t['measured'], 0 if unit == 'groups/s' else 2)} {unit}"
        lines.append(f"| {t['target']} | {measured} | {'PASS' if t['pass'] else 'MISS'} |")
    ceiling = speedup_ceiling(result)
    if ceiling is not None:
        lines += ["", f"Ceiling of (c) vs (a) at N={TARGET_N} on this machine: (a) takes {fmt(ceiling['a_ms'])} ms and "
                  f"(c)'s conditioning alone {fmt(ceiling['c_condition_ms'])} ms (the encode of the fresh observation, "
                  "which (a) also pays once), so even a free denoise gives at most "
                  f"{fmt(ceiling['ceiling_x'], 2)}x."]
    cache = result.get("conditioning_cache")
    if cache:
        lines += ["", "## Conditioning reuse (64x64, the worker's cache; median of "
                  f"{cache['repeats']} groups)", "",
                  "| N | miss: new observation, ms | hit: same observation, ms | hit / miss | hit bitwise = miss |",
                  "|---|---|---|---|---|"]
        for n, r in cache["by_n"].items():
            lines.append(f"| {n} | {fmt(r['miss_ms'])} | {fmt(r['hit_ms'])} | "
                         f"{fmt(None if r['ratio'] is None else 100 * r['ratio'], 1)}% | {r['bitwise_equal']} |")
    for shape_name, sr in result["shapes"].items():
        s = sr["sampling"]
        lines += [
            "",
            f"## Shape `{shape_name}`: {s['height']}x{s['width']}, {s['steps']} steps, horizon {s['horizon']} "
            f"({sr['repeats']} repeat{'s' if sr['repeats'] != 1 else ''})",
            "",
            "Latency, ms (median / p90), and speedup of (c), (d) over (a) and (b):",
            "",
            "| N | (a) seq | (b) sglang batch | (c) worker batch | (d) scheduler e2e | (c) vs (a) | (c) vs (b) "
            "| (d) vs (a) | (d) vs (b) | (c) / (c)@N=1 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for n in sr["ns"]:
            k = str(n)
            cells = [f"{fmt(sr['methods'][m][k]['median_ms'])} / {fmt(sr['methods'][m][k]['p90_ms'])}" for m in METHODS]
            sp = sr["speedup"][k]
            lines.append(
                f"| {n} | " + " | ".join(cells)
                + f" | {fmt(sp['c_vs_a'], 2)}x | {fmt(sp['c_vs_b'], 2)}x | {fmt(sp['d_vs_a'], 2)}x "
                  f"| {fmt(sp['d_vs_b'], 2)}x | {fmt(sr['c_scaling_vs_n1'].get(k), 2)}x |"
            )
        mem_kind = "CUDA max allocated" if meta["device"].startswith("cuda") else "peak RSS over the RSS before the call"
        lines += [
            "",
            f"Per method: physical transformer forwards, conditioning time (stages before denoising; (c)/(d): the "
            f"worker's BatchReport), reducer time, peak memory (MiB, {mem_kind}; (d): the worker process's RSS, "
            "delta / absolute), max |candidate - (a)| over every run:",
            "",
            "| N | method | forwards | conditioning ms | reducer µs | peak mem MiB | max diff vs (a) |",
            "|---|---|---|---|---|---|---|",
        ]
        for n in sr["ns"]:
            for m in METHODS:
                r = sr["methods"][m][str(n)]
                memory = r["memory"]
                mem_cell = _mib(memory["delta_bytes"])
                if m == "d_scheduler_e2e" and memory["kind"] != "cuda_max_allocated":
                    mem_cell += f" / {_mib(memory['peak_bytes'])}"
                diff = r["parity_max_abs_diff_vs_a"]
                diff_cell = "0.0 (bitwise)" if diff == 0.0 else f"{diff:.3g}"
                lines.append(
                    f"| {n} | {LABELS[m]} | {fmt(r['forwards'], 0)} | {fmt(r['condition_ms'], 2)} "
                    f"| {fmt(r['reducer_us'], 1)} | {mem_cell} | {diff_cell} |"
                )
        lines += [
            "",
            "Scheduler overhead, (d) vs (c) for the same group (added ms: median of per-repeat paired differences). "
            "Where (d)'s time goes (medians): the model work the worker reports (conditioning + denoise + "
            "postprocess), scheduler <-> worker (scheduler-side group time minus that), client <-> scheduler "
            "(client latency minus the scheduler-side group time):",
            "",
            "| N | (c) median ms | (d) median ms | (d) / (c) | added ms (paired median) | (c) model ms "
            "| (d) model ms | (d) scheduler<->worker ms | (d) client<->scheduler ms | added outside the model ms |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for n in sr["ns"]:
            o = sr["overhead"][str(n)]
            lines.append(f"| {n} | {fmt(o['c_median_ms'])} | {fmt(o['d_median_ms'])} | {fmt(o['ratio_d_over_c'], 3)} "
                         f"| {fmt(o['added_ms_median_paired'], 2)} | {fmt(o.get('c_model_ms'))} "
                         f"| {fmt(o.get('d_model_ms'))} | {fmt(o.get('d_scheduler_worker_ms'), 2)} "
                         f"| {fmt(o.get('d_client_scheduler_ms'), 2)} | {fmt(o.get('outside_model_added_ms'), 2)} |")
        lines += _path_table(sr)
    null = result.get("null_worker")
    if null:
        pure = null["pure"]
        lines += [
            "",
            f"## Scheduler with a null worker ({null['groups']} groups of {null['count']} candidates sent at once, "
            f"worker capacity {null['capacity']}, median of {null['bursts']} burst{'s' if null['bursts'] != 1 else ''})",
            "",
            "| measure | value |",
            "|---|---|",
            f"| admitted groups/s over ZMQ (PING barrier behind the burst) | {fmt(null['admitted_groups_per_s'], 0)} |",
            f"| end-to-end groups/s (last reply) | {fmt(null['e2e_groups_per_s'], 0)} |",
            f"| time to reply, p50 / p99 ms (1,000 queued) | {fmt(null['reply_latency_p50_ms'])} / "
            f"{fmt(null['reply_latency_p99_ms'])} |",
            f"| every group done | {'yes' if null['all_done'] else 'NO'} |",
            f"| one group at a time, nothing queued: round trip p50 / p90 ms (the scheduler path with no model work) "
            f"| {fmt(null['round_trip_ms']['median'], 2)} / {fmt(null['round_trip_ms']['p90'], 2)} |",
            f"| in-process admission (decide + GroupState.admit), groups/s | {fmt(pure['groups_per_s'], 0)} |",
            f"| in-process admission latency p50 / p99 µs | {fmt(pure['latency_p50_us'], 1)} / "
            f"{fmt(pure['latency_p99_us'], 1)} |",
        ]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p}]({p})" for p in plots]
    lines += [
        "",
        "Notes: this is a shared 2-core machine; methods run side by side and interleaved, so compare ratios, "
        "not absolute times. The tiny random-weight checkpoint mostly measures per-call overhead. sglang's "
        "per-request progress bar and info logs are silenced in the benchmark process for (a) and (b).",
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_outputs(result: dict, opts: dict) -> dict:
    out_dir = opts["out"]
    out_dir.mkdir(parents=True, exist_ok=True)
    device_tag = "cuda" if opts["device"].startswith("cuda") else "cpu"
    json_name = f"bench_{device_tag}{'_smoke' if opts['smoke'] else ''}.json"
    plots = write_plots(result, out_dir) if opts["plots"] else []
    result["meta"]["files"] = {"json": json_name, "report": "report.md", "plots": plots}
    (out_dir / json_name).write_text(json.dumps(result, indent=1, default=json_default) + "\n")
    report = write_report(result, out_dir, json_name, plots)
    return {"json": out_dir / json_name, "report": report, "plots": [out_dir / p for p in plots]}


def summary(result: dict) -> str:
    lines = []
    for t in result["targets"]:
        lines.append(f"  {'PASS' if t['pass'] else 'MISS'}  {t['target']}: {fmt(t['measured'], 2)} {t['unit']}")
    return "\n".join(lines)


def _path_table(sr: dict) -> list[str]:
    """(d)'s time outside the model, hop by hop (bench/shape.path_split)."""
    rows = [(n, (sr["methods"]["d_scheduler_e2e"][str(n)]["extra"] or {})) for n in sr["ns"]]
    rows = [(n, e) for n, e in rows if e.get("path_client_ms") is not None]
    if not rows:
        return []
    lines = ["", "Where (d)'s time outside the model goes (medians, ms): the client's hops and codec (client "
             "latency minus the scheduler's receipt-to-reply), the scheduler around the group (decode, "
             "admission and reply, outside the group's engine time), the worker link (both hops, dispatch and "
             "fold: engine time minus the worker's own receipt-to-result), and the worker outside the model "
             "(its receipt-to-result minus the model work it reports):", "",
             "| N | client hops | scheduler | worker link | worker, outside the model | sum |", "|---|---|---|---|---|---|"]
    for n, e in rows:
        parts = [e["path_client_ms"], e["path_scheduler_ms"], e["path_worker_link_ms"], e["path_worker_ms"]]
        lines.append(f"| {n} | " + " | ".join(fmt(p, 2) for p in parts) + f" | {fmt(sum(parts), 2)} |")
    return lines
