"""The method benchmark's PNG plots: latency vs N (median, whisker to p90) and speedup vs N, per shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from candidate_scheduler.bench.settings import LABELS, METHODS


def write_plots(result: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    colors = {"a_sequential": "#888888", "b_sglang_batch": "#e69f00", "c_worker_batch": "#0072b2",
              "d_scheduler_e2e": "#009e73"}
    for shape_name, sr in result["shapes"].items():
        s = sr["sampling"]
        title = f"{shape_name}: {s['height']}x{s['width']}, {s['steps']} steps ({result['meta']['device']})"
        ns = sr["ns"]
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
        for m in METHODS:
            med = np.array([sr["methods"][m][str(n)]["median_ms"] for n in ns])
            p90 = np.array([sr["methods"][m][str(n)]["p90_ms"] for n in ns])
            ax.errorbar(ns, med, yerr=[np.zeros_like(med), np.maximum(p90 - med, 0)], marker="o", capsize=3,
                        label=LABELS[m], color=colors[m])
        ax.set_ylim(bottom=0)
        names.append(_save(plt, fig, ax, ns, title, "latency, ms (median; whisker to p90)",
                           out_dir / f"latency_{shape_name}.png"))

        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
        for key, label, color, style in (
            ("c_vs_a", "(c) vs (a) sequential", colors["c_worker_batch"], "-"),
            ("c_vs_b", "(c) vs (b) sglang batch", colors["c_worker_batch"], "--"),
            ("d_vs_a", "(d) vs (a) sequential", colors["d_scheduler_e2e"], "-"),
            ("d_vs_b", "(d) vs (b) sglang batch", colors["d_scheduler_e2e"], "--"),
        ):
            ax.plot(ns, [sr["speedup"][str(n)][key] for n in ns], style, marker="o", color=color, label=label)
        ax.axhline(1.0, color="black", lw=0.8)
        names.append(_save(plt, fig, ax, ns, title, "speedup (ratio of median latencies)",
                           out_dir / f"speedup_{shape_name}.png"))
    return names


def _save(plt, fig, ax, ns: list, title: str, ylabel: str, path: Path) -> str:
    """Label a plot of some quantity against N the way every plot here is, write it, and close it."""
    ax.set_xlabel("N candidates")
    ax.set_ylabel(ylabel)
    ax.set_xticks(ns)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name

