"""bench_cuda.json, report_cuda.md and gpu_latency.png of `make gpu-check`: the headline ratios against
issue 24's targets, the equivalence bound, the method table, the device's ceiling and what each phase
cost. `python -m candidate_scheduler.bench.gpu_report DIR` draws the plot again from DIR's files (and
DIR/gpu_ceiling.json where the ceiling was a run of its own)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from candidate_scheduler.bench.common import json_default
from candidate_scheduler.bench.gpu_profile import markdown as profile_markdown

LABELS = {"a_sequential": "(a) sequential sglang", "c_worker_batch": "(c) worker batch",
          "d_scheduler_e2e": "(d) scheduler end to end", "c_batched_calls": "(c) candidates batched in one call"}


def _latency(rows: list[dict], method: str, n: int) -> float | None:
    for row in rows:
        if row["method"] == method and row["n"] == n:
            return row["latency_s"]
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def headline(result: dict) -> dict:
    """Issue 24's four figures (None where a phase did not finish), and beside them (c) with the
    candidates batched in one transformer call where the worker's default is one a call."""
    methods = result["phases"].get("methods", {}).get("result")
    eq = result["phases"].get("equivalence", {}).get("result") or {}
    rows = methods["rows"] if methods else []
    c1, c8 = _latency(rows, "c_worker_batch", 1), _latency(rows, "c_worker_batch", 8)
    a8, d8 = _latency(rows, "a_sequential", 8), _latency(rows, "d_scheduler_e2e", 8)
    b1, b8 = _latency(rows, "c_batched_calls", 1), _latency(rows, "c_batched_calls", 8)
    return {"c_n8_over_n1": _ratio(c8, c1), "c_n8_over_n1_target": "<= 1.3",
            "c_vs_a_speedup_n8": _ratio(a8, c8), "c_vs_a_speedup_n8_target": ">= 4.5",
            "d_over_c_n8": _ratio(d8, c8), "d_minus_c_n8_ms": None if d8 is None or c8 is None else (d8 - c8) * 1e3,
            "call_rows": (methods or {}).get("call_rows", eq.get("call_rows")),
            "batched_calls_n8_over_n1": _ratio(b8, b1), "batched_calls_vs_a_speedup_n8": _ratio(a8, b8),
            "equivalence_max_abs": eq.get("max_abs_diff"), "equivalence_bitwise": eq.get("bitwise"),
            "equivalence_bound": eq.get("bound"), "equivalence_within_bound": eq.get("within_bound"),
            "equivalence_batched_calls_max_abs": (eq.get("batched_calls") or {}).get("max_abs_diff"),
            "equivalence_batch_invariant_max_abs": (eq.get("batch_invariant") or {}).get("max_abs_diff")}


def _per_call(rows) -> str:
    """A call_rows value in words: how many candidates one transformer call carries."""
    if rows is None:
        return "-"
    return "all of a cohort's candidates" if rows == "all" else f"{rows} candidate{'' if rows == 1 else 's'}"


def _f(v, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def _header(result: dict) -> list[str]:
    meta, env = result["meta"], result["phases"].get("env", {}).get("result", {})
    h, ckpt = result["headline"], result["checkpoint"]
    return [f"# GPU check ({'DRY RUN, no figures' if meta['dry_run'] else env.get('device_name', '?')})", "",
            f"Written by `make gpu-check` at {meta['git']} on {meta['created']}; {meta['wall_s']} s of a "
            f"{meta['budget_s']:.0f} s budget. Random weights (fixed seed): latency and memory are the real "
            "model's, actions are not meaningful.", "",
            f"- nvidia-smi: `{env.get('nvidia_smi', '-')}`",
            f"- torch {env.get('torch', '-')} (CUDA {env.get('torch_cuda', '-')}), sglang {env.get('sglang', '-')}, "
            f"python {env.get('python', '-')}, {env.get('cpu_count', '-')} CPUs",
            f"- sgl_kernel: {env.get('sgl_kernel', '-')}; sglang ops: "
            + _ops_line(meta["ops"], result["phases"]),
            f"- checkpoint: {ckpt.get('written_by')}"
            + (f", {ckpt['bytes'] / 2**30:.1f} GiB in {ckpt['wall_s']} s to `{ckpt['dir']}`" if ckpt.get("bytes") else ""),
            "", "## Headline (issue 24's targets)", "",
            f"One transformer call of the worker carries {_per_call(h['call_rows'])} at most (`--call-rows`, by "
            "default 1 on CUDA: only sglang's own call shape keeps a candidate bitwise there).", "",
            "| figure | measured | target |", "|---|---|---|",
            f"| (c) latency N=8 / N=1 | {_f(h['c_n8_over_n1'], '{:.2f}x')} | <= 1.3x |",
            f"| (c) vs (a) at N=8 | {_f(h['c_vs_a_speedup_n8'], '{:.2f}x')} | >= 4.5x |",
            f"| (d) / (c) at N=8 | {_f(h['d_over_c_n8'], '{:.3f}x')} ({_f(h['d_minus_c_n8_ms'], '{:.0f}')} ms) | - |",
            f"| equivalence max abs diff | {_f(h['equivalence_max_abs'], '{:.3g}')}"
            f"{' (bitwise)' if h['equivalence_bitwise'] else ''} | within atol/rtol "
            f"{(h['equivalence_bound'] or {}).get('atol', '-')} (declared by the adapter) |",
            f"| (c) with the candidates batched in one call: N=8 / N=1, vs (a) at N=8 | "
            f"{_f(h['batched_calls_n8_over_n1'], '{:.2f}x')}, {_f(h['batched_calls_vs_a_speedup_n8'], '{:.2f}x')} | - |",
            f"| equivalence, candidates batched in one call | {_f(h['equivalence_batched_calls_max_abs'], '{:.3g}')} "
            "| 0 (bitwise) |",
            f"| the same with sglang's batch-invariant kernels | "
            f"{_f(h['equivalence_batch_invariant_max_abs'], '{:.3g}')} | 0 (bitwise) |", ""]


def _ops_line(ops: str, phases: dict) -> str:
    shipped = phases.get("probe_shipped", {})
    built = (f"ran in the probe, in {shipped['wall_s']} s" if "result" in shipped
             else f"did not finish in the probe ({shipped['rc']}), in {shipped['wall_s']} s" if shipped
             else "were not probed")
    if ops == "native":
        return ("native (sglang's own PyTorch forms, no custom CUDA kernel: a conservative latency); "
                f"the shipped kernels {built}")
    return {"shipped": "as shipped (the native probe failed)", "none": "none ran"}.get(ops, ops)


def _equivalence(eq: dict) -> list[str]:
    s = eq["sampling"]
    return ["## Equivalence", "",
            f"N={eq['n']} candidates of one group against sglang's pipeline run alone per seed, "
            f"{s['height']}x{s['width']}, {s['steps']} steps, guidance {s['guidance_scale']} (CFG).", "",
            f"As the worker runs them by default ({_per_call(eq.get('call_rows', 'all'))} a transformer call"
            f"{'; text K/V rows keyed by the request call that computes them' if eq.get('text_by_request_rows') else ''}):",
            "",
            f"- max abs diff {eq['max_abs_diff']:.3g}, max relative (to max |action|) {eq['max_rel_diff']:.3g}, "
            f"bitwise: {eq['bitwise']}, within the declared bound: {eq['within_bound']}, finite: {eq['finite']}",
            f"- per candidate max abs: {', '.join(f'{v:.3g}' for v in eq['per_candidate_max_abs'])}",
            f"- the group {eq['batched_s']:.2f} s, alone x{eq['n']} {eq['alone_s']:.2f} s", ""] + _pass(
        eq, "batched_calls", "With the candidates batched in one transformer call") + _pass(
        eq, "batch_invariant", "Batched in one call, with sglang's batch-invariant kernels "
        "(sglang.srt.batch_invariant_ops) on both sides") + (
        profile_markdown(eq["profile"]) if eq.get("profile")
        else [f"No profile: {eq['profile_error']}.", ""] if eq.get("profile_error") else [])


def _pass(eq: dict, key: str, title: str) -> list[str]:
    """One more comparison of the equivalence phase, its times against the default pass's."""
    bi = eq.get(key) or {}
    if "max_abs_diff" not in bi:
        return [f"{title}: {bi.get('skipped') or bi.get('error') or 'not run'}.", ""]
    return [f"{title}:", "",
            f"- max abs diff {bi['max_abs_diff']:.3g}, bitwise: {bi['bitwise']}, within the declared bound: "
            f"{bi['within_bound']}",
            f"- the group {bi['batched_s']:.2f} s ({bi['batched_s'] / eq['batched_s']:.2f}x the default), "
            f"alone x{bi['n']} {bi['alone_s']:.2f} s ({bi['alone_s'] / eq['alone_s']:.2f}x)", ""]


def _fixed(m: dict) -> str:
    fixed = m.get("fixed_per_run_s")  # older results have none
    return "" if fixed is None else f", and a run {fixed * 1e3:.0f} ms besides its steps"


def _methods(m: dict) -> list[str]:
    s = m["shape"]
    batched = any(r["method"] == "c_batched_calls" for r in m["rows"])
    lines = ["## Methods", "",
             f"{s['height']}x{s['width']}, {s['steps']} steps (the most that fit the phase's time, of "
             f"{m['steps_most']}; a candidate-step took {m['per_candidate_step_s'] * 1e3:.1f} ms in (a)'s "
             f"warm-ups{_fixed(m)}), guidance 1 (no CFG), one timed run per (method, N) after one warm-up per "
             f"method. (c) and (d) at {_per_call(m.get('call_rows', 'all'))} a transformer call"
             + ("; (c'): (c) with the candidates batched in one call." if batched else "."), "",
             "| N | (a) s | (c) s | (d) s | (c)/(a) speed-up | (d)-(c) ms | (c) peak GiB | (a) peak GiB | "
             "max abs vs (a) (c) / (d) |" + (" (c') s | (c')/(a) | (c') max abs vs (a) |" if batched else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if batched else "")]
    for n in sorted({r["n"] for r in m["rows"]}):
        row = {r["method"]: r for r in m["rows"] if r["n"] == n}
        a, c, d, b = (row.get(k, {}) for k in ("a_sequential", "c_worker_batch", "d_scheduler_e2e", "c_batched_calls"))
        lines.append(f"| {n} | {_f(a.get('latency_s'))} | {_f(c.get('latency_s'))} | {_f(d.get('latency_s'))} | "
                     f"{_f(_ratio(a.get('latency_s'), c.get('latency_s')), '{:.2f}x')} | "
                     f"{_f(None if not d or not c else (d['latency_s'] - c['latency_s']) * 1e3, '{:.0f}')} | "
                     f"{_f(c.get('peak_gib'), '{:.1f}')} | {_f(a.get('peak_gib'), '{:.1f}')} | "
                     f"{_f(c.get('max_abs_vs_a'), '{:.3g}')} / {_f(d.get('max_abs_vs_a'), '{:.3g}')} |"
                     + (f" {_f(b.get('latency_s'))} | {_f(_ratio(a.get('latency_s'), b.get('latency_s')), '{:.2f}x')} | "
                        f"{_f(b.get('max_abs_vs_a'), '{:.3g}')} |" if batched else ""))
    return lines + ["", f"Model load {m['load_s']:.0f} s in process; both ready {m['ready_s']:.0f} s.", ""]


def _load(ld: dict) -> list[str]:
    s = ld["shape"]
    lines = ["## Load", "", f"A burst of policy groups at {s['height']}x{s['width']}, {s['steps']} steps, each with "
             "its own observation, under each batching mode (one device worker each).", "",
             "| mode | groups x N | done/s | candidates/s | p50 / p99 ms | forwards per group (median) | statuses |",
             "|---|---|---|---|---|---|---|"]
    for mode, m in ld["modes"].items():
        lines.append(f"| {mode} | {m['groups']} x {m['count']} | {m['groups_per_s']:.2f} | {m['candidates_per_s']:.1f} | "
                     f"{m['latency_ms']['p50']:.0f} / {m['latency_ms']['p99']:.0f} | {m['forwards_per_group_median']:.0f} | "
                     f"{m['statuses']} |")
    return lines + [""]


def _ceiling(c: dict) -> list[str]:
    from candidate_scheduler.bench.gpu_ceiling import markdown as ceiling_markdown

    return ["## Device ceiling"] + ceiling_markdown(c).splitlines()[1:] + [""]


def markdown(result: dict) -> str:
    phases, fleet = result["phases"], result.get("fleet", {})
    lines = _header(result)
    for name, section in (("equivalence", _equivalence), ("methods", _methods), ("load", _load),
                          ("ceiling", _ceiling)):
        if phases.get(name, {}).get("result"):
            lines += section(phases[name]["result"])
    if fleet.get("result"):
        lines += ["## Fleet", "", f"`bench --fleet{' --smoke' if fleet['smoke'] else ''}` on this machine's CPUs "
                  f"({fleet['wall_s']} s): fleet_cuda.md, and `fleet` in bench_cuda.json.", ""]
    lines += ["## Phases", "", "| phase | wall s | cap s | outcome |", "|---|---|---|---|"]
    for name, rec in phases.items():
        outcome = f"partial ({rec['rc']})" if rec.get("partial") else "ok" if "result" in rec else rec["rc"]
        lines.append(f"| {name} | {rec['wall_s']} | {rec['cap_s']} | {outcome} |")
    if fleet:
        lines.append(f"| fleet | {fleet.get('wall_s', '-')} | - | {fleet.get('rc', fleet.get('skipped'))} |")
    return "\n".join(lines) + "\n"


def write_plot(result: dict, path: Path, ceiling: dict | None = None) -> Path | None:
    """Time per denoise step against N for (a), (c), (d), beside the least time the device's GEMMs
    alone allow (the ceiling) and issue 24's target for (c)."""
    methods = result["phases"].get("methods", {}).get("result")
    ceiling = ceiling or result["phases"].get("ceiling", {}).get("result")
    if not methods:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = methods["shape"]
    shape = f"{s['height']}x{s['width']}"
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for method, label in LABELS.items():
        rows = sorted((r["n"], r["latency_s"]) for r in methods["rows"] if r["method"] == method)
        if not rows:
            continue
        ax.plot([n for n, _ in rows], [t / s["steps"] * 1e3 for _, t in rows], marker="o", label=label)
    c1 = _latency(methods["rows"], "c_worker_batch", 1)
    ns = sorted({r["n"] for r in methods["rows"]})
    if c1:
        ax.plot(ns, [1.3 * c1 / s["steps"] * 1e3] * len(ns), ":", color="black", label="issue 24's target for (c): 1.3x N=1")
    bound = [(g["n"], g["forward_gemm_ms"]) for g in (ceiling or {}).get("gemm", []) if g["shape"] == shape]
    if bound:
        ax.plot([n for n, _ in bound if n <= max(ns)], [ms for n, ms in bound if n <= max(ns)], "--", color="gray",
                label="the layers' GEMMs alone on this device")
    ax.set_xlabel("candidates N")
    ax.set_ylabel("ms per denoise step (latency / steps)")
    ax.set_ylim(bottom=0)
    device = result["phases"].get("env", {}).get("result", {}).get("device_name", "?")
    ax.set_title(f"{shape}, {s['steps']} steps, full-size Cosmos3 ({device})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_outputs(result: dict, out: Path) -> list[Path]:
    result["headline"] = headline(result)
    suffix = "_dry" if result["meta"]["dry_run"] else ""
    files = [out / f"bench_cuda{suffix}.json", out / f"report_cuda{suffix}.md"]
    files[0].write_text(json.dumps(result, indent=2, default=json_default) + "\n")
    files[1].write_text(markdown(result))
    try:
        plot = write_plot(result, out / f"gpu_latency{suffix}.png")
    except Exception as exc:  # the figures are in the JSON and the report; `main` draws the plot again
        print(f"gpu-check: no plot ({type(exc).__name__}: {exc})", flush=True)
        plot = None
    return files + ([plot] if plot else [])


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    ceiling = folder / "gpu_ceiling.json"
    plot = write_plot(json.loads((folder / "bench_cuda.json").read_text()), folder / "gpu_latency.png",
                      json.loads(ceiling.read_text()) if ceiling.exists() else None)
    print(plot or "no method rows: no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
