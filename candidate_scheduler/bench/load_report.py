"""The load benchmark's outputs: `load_<device>[_smoke].json`, `load_report.md` (tables, the targets with
PASS/MISS) and `load_p99.png` (p99 latency against offered load, one panel per shape)."""

from __future__ import annotations

import json
from pathlib import Path

from candidate_scheduler.bench.common import fmt, json_default
from candidate_scheduler.bench.load_plan import COMPARE_AT, COUNTS, SLO_FACTOR

ARM_LABELS = {
    "sglang_sequential": "sglang sequential (one request per candidate, FCFS)",
    "dispatch": "dispatch batching",
    "step": "step-level batching",
    "step_inline": "step-level batching, joins conditioned between two steps (`worker --conditioning inline`)",
}
ARM_COLORS = {"sglang_sequential": "#888888", "dispatch": "#0072b2", "step": "#009e73", "step_inline": "#d55e00"}


def _ratio(num, den):
    return None if num is None or den is None or den == 0 else float(num) / float(den)


def consistent_capacity(rows: list[dict]) -> float | None:
    """The highest offered load that passed the SLO below the lowest load that failed it, over every
    point of an arm (search, sweep and the comparison point). The search's capacity rests on short
    probes: this is lower when a longer point below it failed (a backlog a short window never builds),
    higher when a sweep point above it passed. None when no point passed below the lowest failure."""
    failed = [r["offered_groups_per_s"] for r in rows if not r["p99_within_slo"]]
    ceiling = min(failed, default=float("inf"))
    passed = [r["offered_groups_per_s"] for r in rows if r["p99_within_slo"] and r["offered_groups_per_s"] < ceiling]
    return max(passed, default=None)


def capacity_bracket(rows: list[dict]) -> tuple[float | None, float | None]:
    """Where the arm's capacity lies, as far as its points tell: [the consistent capacity, the lowest
    load that failed) -- None above when none failed. The search steps geometrically from each arm's
    own one-at-a-time rate, so two arms' probes fall on different loads, and a ratio of their
    capacities carries that grid: it resolves a difference only when the brackets do not overlap."""
    failed = [r["offered_groups_per_s"] for r in rows if not r["p99_within_slo"]]
    return consistent_capacity(rows), min(failed, default=None)


def bracket_verdict(step: tuple | None, dispatch: tuple | None) -> str | None:
    """`step` against `dispatch` by their capacity brackets (capacity_bracket)."""
    if step is None or dispatch is None or step[0] is None or dispatch[0] is None:
        return None
    if dispatch[1] is not None and step[0] >= dispatch[1]:
        return "`step` above `dispatch` (its lowest passing load is above every load `dispatch` failed)"
    if step[1] is not None and step[1] <= dispatch[0]:
        return "`step` below `dispatch` (it failed a load `dispatch` passed)"
    return "not resolved: the brackets overlap, so either may be the higher"


def targets(shape: dict) -> list[dict]:
    """The issue's targets on one shape (reported, never asserted); `measured` None when an arm is absent."""
    cap = shape["capacity_groups_per_s"]
    unloaded = shape["unloaded"]
    compare = shape.get("compare", {})

    def p99_at_compare(arm):
        row = compare.get(arm)
        return None if row is None else row["p99_s"]

    def unloaded_mean(arm):
        return unloaded[arm]["unloaded_mean_s"] if arm in unloaded else None

    rows = [
        ("`step` capacity >= 1.3x `dispatch`", _ratio(cap.get("step"), cap.get("dispatch")), "x", lambda v: v >= 1.3),
        ("`step` capacity >= 4x `sglang_sequential`", _ratio(cap.get("step"), cap.get("sglang_sequential")), "x",
         lambda v: v >= 4.0),
        (f"at {COMPARE_AT:g}x `dispatch` capacity, `step` p99 <= 0.6x `dispatch` p99",
         _ratio(p99_at_compare("step"), p99_at_compare("dispatch")), "x", lambda v: v <= 0.6),
        ("unloaded latency of `step` within 5% of `dispatch` (mean over the counts of the per-count medians)",
         _ratio(unloaded_mean("step"), unloaded_mean("dispatch")), "x", lambda v: v <= 1.05),
    ]
    checked = {arm: consistent_capacity(rows) for arm, rows in shape.get("points", {}).items()}
    rows.append(("(check) `step` / `dispatch` capacity, each the highest load passed below its lowest failed point",
                 _ratio(checked.get("step"), checked.get("dispatch")), "x", None))
    if "step_inline" in cap:  # the conditioning thread's before/after, side by side: no target of its own
        rows += [
            ("(comparison) `step` capacity / `step_inline` capacity", _ratio(cap.get("step"), cap.get("step_inline")),
             "x", None),
            (f"(comparison) at {COMPARE_AT:g}x `dispatch` capacity, `step` p99 / `step_inline` p99",
             _ratio(p99_at_compare("step"), p99_at_compare("step_inline")), "x", None),
        ]
    return [{"shape": shape["shape"], "target": t, "measured": m, "unit": u,
             "result": "n/a" if m is None else ("-" if ok is None else "PASS" if ok(m) else "MISS")}
            for t, m, u, ok in rows]


def build_result(shapes: list[dict], meta: dict) -> dict:
    """`arms`: arm -> every point of every shape (each row names its shape); `capacity_groups_per_s`:
    arm -> capacity on the first shape (64x64, the action-policy shape), with every shape's in
    `capacity_groups_per_s_by_shape`; the per-shape details under `shapes`."""
    arms: dict[str, list[dict]] = {}
    for shape in shapes:
        for arm, rows in shape["points"].items():
            arms.setdefault(arm, []).extend(rows)
    first = shapes[0] if shapes else {"capacity_groups_per_s": {}}
    return {
        "meta": meta,
        "arms": arms,
        "capacity_groups_per_s": dict(first["capacity_groups_per_s"]),
        "capacity_groups_per_s_by_shape": {s["shape"]: s["capacity_groups_per_s"] for s in shapes},
        "targets": [t for s in shapes for t in targets(s)],
        "shapes": {s["shape"]: {**{k: v for k, v in s.items() if k != "points"},
                                "capacity_consistent_groups_per_s": {arm: consistent_capacity(rows)
                                                                     for arm, rows in s["points"].items()},
                                "capacity_bracket_groups_per_s": {arm: list(capacity_bracket(rows))
                                                                  for arm, rows in s["points"].items()}}
                   for s in shapes},
    }


def write_plot(result: dict, out_dir: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(result["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.4 * len(shapes), 4.4), dpi=100, squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        info = result["shapes"][shape]
        for arm, rows in result["arms"].items():
            rows = [r for r in rows if r["shape"] == shape and r["p99_s"] is not None]
            if not rows:
                continue
            color = ARM_COLORS.get(arm)
            ax.plot([r["offered_groups_per_s"] for r in rows], [r["p99_s"] for r in rows], marker="o", color=color,
                    label=ARM_LABELS.get(arm, arm))
            ax.axhline(info["unloaded"][arm]["slo_s"], color=color, lw=0.8, ls=":")
            ax.axvline(info["capacity_groups_per_s"][arm], color=color, lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, groups/s (open-loop Poisson)")
        ax.set_ylabel("p99 latency, s")
        ax.set_title(f"{shape}, {info['steps']} steps ({result['meta']['device']}): dotted = {SLO_FACTOR:g}x unloaded, "
                     "dashed = capacity", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    name = "load_p99.png"
    fig.savefig(out_dir / name)
    plt.close(fig)
    return name


def write_report(result: dict, out_dir: Path, json_name: str, plot: str | None) -> Path:
    meta = result["meta"]
    lines = [
        f"# Load benchmark{' (smoke)' if meta['smoke'] else ''}",
        "",
        f"{meta['created']} · git {meta['git']} · device `{meta['device']}` ({meta['cpu_count']} CPUs) · sglang "
        f"{meta['sglang']} · model `{Path(meta['model']).name}` · arrival seed {meta['seed']} · wall "
        f"{meta['wall_s']:.0f} s · load average {meta['loadavg_start']} at start, {meta['loadavg_end']} at end. "
        f"Raw data: [`{json_name}`]({json_name}).",
        "",
        "Open-loop Poisson arrivals of groups (counts uniform over 1, 2, 4, 8; 20 steps); the sender never waits "
        "for replies and latency runs from each group's scheduled arrival to its reply. Arms: "
        + "; ".join(f"**{a}**: {ARM_LABELS.get(a, a)}"
                    + (f" (`serve {' '.join(meta['arm_flags'].get(a, ()))}`)" if a in meta["arm_flags"] else "")
                    for a in meta["arms"]) + ". "
        f"SLO = {SLO_FACTOR:g}x the arm's unloaded latency (its slowest count's median, sent alone); capacity = the "
        "highest offered load whose p99 stays within it; goodput = groups answered `done` within it, per second.",
    ]
    for arm, notes in meta.get("notes", {}).items():
        for note in notes:
            lines.append(f"\n- `{arm}`: {note}")
    lines += ["", "## Targets", "", "| shape | target | measured | result |", "|---|---|---|---|"]
    for t in result["targets"]:
        lines.append(f"| {t['shape']} | {t['target']} | {fmt(t['measured'], 2)} {t['unit']} | {t['result']} |")
    for shape, info in result["shapes"].items():
        arms = list(info["unloaded"])
        pool = info.get("observation_pool")
        observations = (f"observations from a pool of {pool}, encoded by every arm at warm-up" if pool
                        else "every group a new observation")
        lines += ["", f"## {shape}, {info['steps']} steps ({observations})", "",
                  "Unloaded latency (one group at a time), median ms per count, and capacity:", "",
                  "| arm | " + " | ".join(f"N={c}" for c in COUNTS) + " | unloaded (max) ms | mix mean ms | SLO ms "
                  "| capacity groups/s | capacity | consistent with every point | lies in groups/s |",
                  "|---|" + "---|" * (len(COUNTS) + 7)]
        brackets = info.get("capacity_bracket_groups_per_s", {})
        for arm in arms:
            u = info["unloaded"][arm]
            cells = " | ".join(fmt(u["per_count_median_s"][str(c)] * 1e3) for c in COUNTS)
            lines.append(f"| {arm} | {cells} | {fmt(u['unloaded_s'] * 1e3)} | {fmt(u['unloaded_mean_s'] * 1e3)} "
                         f"| {fmt(u['slo_s'] * 1e3)} | {fmt(info['capacity_groups_per_s'][arm], 2)} "
                         f"| {info['capacity_search'][arm]['bound']} ({info['capacity_search'][arm]['probes']} probes) "
                         f"| {fmt(info.get('capacity_consistent_groups_per_s', {}).get(arm), 2)} "
                         f"| {_bracket_text(brackets.get(arm))} |")
        lines += ["", "Capacity is the search's (the highest probe within the SLO, below the lowest that failed). "
                  "*Consistent with every point* applies the same rule to all the arm's points, the sweep and the "
                  "longer comparison point included: lower when a point below the search's capacity failed, higher when "
                  "one above it passed. *Lies in*: from that load to the lowest load that failed. Each arm's search "
                  "steps from its own one-at-a-time rate, so the arms' probes fall on different loads; a capacity "
                  "ratio resolves a difference only where the brackets do not overlap."]
        verdict = bracket_verdict(*(tuple(brackets[a]) if a in brackets else None for a in ("step", "dispatch")))
        if verdict:
            lines += ["", f"`step` against `dispatch` by these brackets: {verdict}."]
        if info.get("compare_rate_groups_per_s"):
            lines += ["", f"Comparison point: {fmt(info['compare_rate_groups_per_s'], 2)} groups/s = {COMPARE_AT:g}x "
                      "the `dispatch` capacity."]
        for arm in arms:
            lines += ["", f"`{arm}` (capacity {fmt(info['capacity_groups_per_s'][arm], 2)} groups/s):", "",
                      "| phase | offered groups/s | x capacity | sent | p50 ms | p99 ms | goodput groups/s "
                      "| first step p50 ms | rows/forward | statuses |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for r in (r for r in result["arms"][arm] if r["shape"] == shape):
                early = " (stopped early)" if r["stopped_early"] else ""
                statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
                lines.append(
                    f"| {r['phase']}{early} | {fmt(r['offered_groups_per_s'], 2)} | {fmt(r['fraction_of_capacity'], 2)} "
                    f"| {r['groups_sent']}/{r['groups_planned']} | {fmt(r['p50_s'] * 1e3 if r['p50_s'] is not None else None)} "
                    f"| {fmt(r['p99_s'] * 1e3 if r['p99_s'] is not None else None)} | {fmt(r['goodput_groups_per_s'], 2)} "
                    f"| {fmt(r['first_step_p50_s'] * 1e3 if r['first_step_p50_s'] is not None else None)} "
                    f"| {fmt(r['rows_per_forward'], 2)} | {statuses} |")
        lines += _forecast_lines(info, result["arms"], shape)
        lines += ["", "Parity: done replies re-sent alone to sglang's own pipeline (one request per candidate seed):", "",
                  "| arm | groups | counts | bitwise equal |", "|---|---|---|---|"]
        for arm in arms:
            p = info["parity"][arm]
            counts = ", ".join(str(c["count"]) for c in p["checks"])
            lines.append(f"| {arm} | {p['groups']} | {counts} | {'yes' if p['all_bitwise_equal'] else 'NO'} |")
    sources = sorted({(r.get("first_step_source") or "-", r.get("rows_per_forward_source") or "-")
                      for rows in result["arms"].values() for r in rows})
    lines += ["", "Sources of time to first step / rows per forward: "
              + "; ".join(f"{a} / {b}" for a, b in sources) + "."]
    if plot:
        lines += ["", f"![{plot}]({plot})"]
    lines += ["", "Notes: a shared 2-core machine; arms run one at a time, side by side in one run, so compare "
              "ratios. Capacity comes from a short bounded search; each load point is a window of a few seconds.", ""]
    path = out_dir / "load_report.md"
    path.write_text("\n".join(lines))
    return path


def write_outputs(result: dict, out_dir: Path, plots: bool) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    device_tag = "cuda" if result["meta"]["device"].startswith("cuda") else "cpu"
    json_name = f"load_{device_tag}{'_smoke' if result['meta']['smoke'] else ''}.json"
    plot = write_plot(result, out_dir) if plots and result["arms"] else None
    result["meta"]["files"] = {"json": json_name, "report": "load_report.md", "plot": plot}
    (out_dir / json_name).write_text(json.dumps(result, indent=1, default=json_default) + "\n")
    report = write_report(result, out_dir, json_name, plot)
    return {"json": out_dir / json_name, "report": report, "plot": None if plot is None else out_dir / plot}


def summary(result: dict) -> str:
    lines = [f"  capacity {shape}: " + ", ".join(f"{a} {fmt(c, 2)}" for a, c in caps.items()) + " groups/s"
             for shape, caps in result["capacity_groups_per_s_by_shape"].items()]
    lines += [f"  {t['result']:4}  {t['shape']} {t['target']}: {fmt(t['measured'], 2)} {t['unit']}"
              for t in result["targets"]]
    return "\n".join(lines)


def _bracket_text(bracket) -> str:
    if not bracket or bracket[0] is None:
        return "n/a"
    return f"[{bracket[0]:.2f}, {'none failed' if bracket[1] is None else format(bracket[1], '.2f')})"


def rebuild(json_path: Path, plots: bool = True) -> dict:
    """The outputs again from a load JSON (after the report changed): the points are regrouped by shape
    and the targets and consistency figures recomputed; the measurements are the JSON's own."""
    old = json.loads(Path(json_path).read_text())
    shapes = []
    for name, info in old["shapes"].items():
        shape = {k: v for k, v in info.items()
                 if k not in ("capacity_consistent_groups_per_s", "capacity_bracket_groups_per_s")}
        shape["points"] = {arm: [r for r in rows if r["shape"] == name] for arm, rows in old["arms"].items()}
        shapes.append(shape)
    return write_outputs(build_result(shapes, old["meta"]), Path(json_path).parent, plots)


def _forecast_lines(info: dict, arms: dict, shape: str) -> list[str]:
    """The cost model's predictions against what each assignment took (send to result): on an idle
    worker (the unloaded groups, one at a time) and under each load point, per forward label."""
    rows = []
    for arm, u in info["unloaded"].items():
        for label, e in (u.get("forecast_error") or {}).items():
            rows.append((arm, "unloaded (idle worker)", label, e))
        for r in (r for r in arms[arm] if r["shape"] == shape):
            for label, e in (r.get("forecast_error") or {}).items():
                rows.append((arm, r["phase"], label, e))
    if not rows:
        return []
    out = ["", "Forecasts: each assignment's measured time (send to result) over the cost model's prediction "
           "when it was sent (the reply's `forecasts`):", "",
           "| arm | phase | forward | assignments | p10 | p50 | p90 | within 10% |", "|---|---|---|---|---|---|---|---|"]
    for arm, phase, label, e in rows:
        out.append(f"| {arm} | {phase} | {label} | {e['n']} | {e['p10']:.2f} | {e['p50']:.2f} | {e['p90']:.2f} "
                   f"| {e['within_10pct'] * 100:.0f}% |")
    return out


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:] or ["bench/results/load_cpu.json"]:
        print(summary(json.loads(Path(rebuild(Path(path))["json"]).read_text())))
