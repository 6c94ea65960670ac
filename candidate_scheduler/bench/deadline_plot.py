"""The deadline benchmark's plot: deadline-miss rate, goodput and mean served count vs offered load,
both arms."""

from __future__ import annotations

from pathlib import Path

COLORS = {"fixed": "#d55e00", "elastic": "#0072b2"}


def write_plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = result["capacity"]["capacity"]
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 4.0), dpi=100)
    for arm, rows in result["arms"].items():
        x = [r["factor"] for r in rows]
        style = dict(marker="o", color=COLORS.get(arm), label=arm)
        axes[0].plot(x, [100.0 * (r["miss_rate"] or 0.0) for r in rows], **style)
        if all("simulated" in r for r in rows):
            axes[0].plot(x, [100.0 * (r["simulated"]["stepping"]["miss_rate"] or 0.0) for r in rows], ls=":",
                         marker=".", color=COLORS.get(arm), label=f"{arm}, simulated stepping worker")
        axes[1].plot(x, [r["goodput"] or 0.0 for r in rows], **style)
        axes[2].plot(x, [r["mean_served_count"] if r["mean_served_count"] is not None else float("nan")
                         for r in rows], **style)
    axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].axhline(50.0, color="grey", lw=0.8, ls=":")
    axes[0].set_ylabel("deadline misses, % of groups")
    axes[1].set_ylabel("goodput, groups done in time / s")
    offered = sorted({r["factor"] for rows in result["arms"].values() for r in rows})
    axes[1].plot(offered, [f * cap for f in offered], color="grey", lw=0.8, ls="--", label="offered")
    axes[2].set_ylabel("mean served count (done groups)")
    axes[2].set_ylim(0, result["settings"]["count"] + 0.5)
    for ax in axes:
        ax.set_xlabel(f"offered load, x fixed-arm capacity ({cap:.2f} groups/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    s = result["settings"]["sampling"]
    fig.suptitle(f"count 8 under deadlines of {result['deadline_s'] * 1000:.0f} ms (3x unloaded): fixed "
                 f"(min_count 8) vs elastic (min_count 2); {s['height']}x{s['width']}, {s['steps']} steps, "
                 f"1 worker x 8 rows, CPU{' (smoke)' if result['meta']['smoke'] else ''}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
