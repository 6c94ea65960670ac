"""`candidate-scheduler bench --fairness`: one tenant floods the queue, another sends a group every 100 ms.

The scheduler (`serve --curve-dir`, so every client is a keyed principal of its tenant) and K null
workers (`--step-delay`: a denoise step is a sleep, a GPU stand-in) run as real processes; this process
is both clients, each on its own keyed socket. Tenant `rl` floods FLOOD one-candidate groups at once
(an RL step's rollouts); tenant `robots` sends one group every B_EVERY_S, first alone (its unloaded
latency) and then during the flood. Per arm -- fair queueing (the default) or first come first served
(`--no-fair-queueing`); prefetched work sent just in time (the default), at once (`--prefetch-lead
inf`), or no prefetch; staggered starts (the default under dispatch batching) or not (`--no-stagger`);
dispatch or step batching -- reported: the robot's receipt-to-reply p50/p99
(measured by the scheduler) unloaded and under the flood, the flood's throughput against first come
first served with prefetch at once (the most the flood gets), and each process's CPU share (2 cores: a
starved client or worker would show there). Every `done` action is checked against the null model's
answer for its seeds.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import PROMPT, git_rev, loadavg
from candidate_scheduler.bench.fleet import cpu_s, null_model_action
from candidate_scheduler.service.launcher import Launcher

WORKERS = 4
CAPACITY = 8
STEPS = 4
STEP_S = 0.025  # a batch takes STEPS x STEP_S = 0.1 s
SIDE = 64
B_EVERY_S = 0.1
AT_ONCE = ("--prefetch-lead", "inf")  # prefetched work sent as soon as a worker has room (before late prefetch)
ARMS = (("fair", ()), ("fifo", ("--no-fair-queueing",)), ("fair, prefetch at once", AT_ONCE),
        ("fifo, prefetch at once", ("--no-fair-queueing", *AT_ONCE)), ("fair, prefetch 0", ("--prefetch", "0")),
        ("fair, no stagger", ("--no-stagger",)),
        ("fair, step", ("--batching", "step")), ("fifo, step", ("--batching", "step", "--no-fair-queueing")),
        ("fair, step, prefetch at once", ("--batching", "step", *AT_ONCE)),
        ("fifo, step, prefetch at once", ("--batching", "step", "--no-fair-queueing", *AT_ONCE)),
        ("fair, step, prefetch 0", ("--batching", "step", "--prefetch", "0")))
# What `make bench` runs: the arms the targets compare, and first come first served as deployed. The rest
# take one setting away at a time (prefetch, late prefetch); `--fairness-ablations` runs them too -- each
# arm is about 13 s, and all of them would take `make bench` past its 15 minutes.
DEFAULT_ARMS = tuple(a for a in ARMS if a[0] in ("fair", "fifo", "fifo, prefetch at once", "fair, no stagger",
                                                  "fair, step", "fifo, step, prefetch at once"))


async def _arm(handle, keys_dir: Path, flood: int, unloaded: int, image: np.ndarray) -> dict:
    from candidate_scheduler.service.async_client import AsyncClient
    from candidate_scheduler.service.client import make_request
    from candidate_scheduler.service.keys import ClientKeys

    rl = AsyncClient(handle.request, keys=ClientKeys.load(keys_dir, "rl-job"), liveness_s=None)
    robot = AsyncClient(handle.request, keys=ClientKeys.load(keys_dir, "robot"), liveness_s=None)

    def request(tag: str, i: int):
        return make_request(image, PROMPT, request_id=f"{tag}-{i}", count=1, seed=5000 + i, height=SIDE, width=SIDE,
                            steps=STEPS)

    async def timed(client, req, t0: float) -> tuple:
        sent = time.perf_counter() - t0
        r = await client.submit_request(req)
        return req.request_id, sent, time.perf_counter() - t0, r

    t0 = time.perf_counter()
    alone = []
    for i in range(unloaded):
        alone.append(await timed(robot, request("alone", i), t0))
        await asyncio.sleep(max(0.0, (i + 1) * B_EVERY_S - (time.perf_counter() - t0)))
    floods = [request("flood", i) for i in range(flood)]  # encoded before the clock starts
    t0 = time.perf_counter()
    flood_tasks = [asyncio.ensure_future(timed(rl, req, t0)) for req in floods]
    robot_tasks, i = [], 0
    while not all(t.done() for t in flood_tasks):
        robot_tasks.append(asyncio.ensure_future(timed(robot, request("robot", i), t0)))
        i += 1
        await asyncio.sleep(max(0.0, i * B_EVERY_S - (time.perf_counter() - t0)))
    flooded = await asyncio.gather(*flood_tasks)
    during = await asyncio.gather(*robot_tasks)
    rl.close()
    robot.close()
    return {"alone": alone, "flood": flooded, "robot": during}


def _ms(values) -> dict:
    arr = np.asarray(list(values), dtype=float) * 1e3
    if not arr.size:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": int(arr.size), "p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
            "max": float(arr.max())}


def _summary(raw: dict, image: np.ndarray) -> dict:
    wrong, statuses = 0, {}
    for rows in raw.values():
        for _rid, _sent, _at, r in rows:
            statuses[r.status] = statuses.get(r.status, 0) + 1
            if r.status == "done" and not np.array_equal(r.action, null_model_action(image, r.candidate_seeds)):
                wrong += 1
    flood_end = max(at for _rid, _s, at, _r in raw["flood"])
    under = [row for row in raw["robot"] if row[1] < flood_end]  # sent while the flood was still being served

    def receipt(rows):
        return [float(r.metrics["receipt_to_reply_s"]) for *_x, r in rows if r.status == "done"]

    done = sum(r.status == "done" for *_x, r in raw["flood"])
    robots_done = sum(r.status == "done" and at <= flood_end for _rid, _sent, at, r in raw["robot"])
    return {
        "robot_unloaded_ms": _ms(receipt(raw["alone"])),
        "robot_under_flood_ms": _ms(receipt(under)),
        "robot_under_flood_series": [(sent, float(r.metrics.get("receipt_to_reply_s", 0.0)))
                                     for _rid, sent, _at, r in under],
        "flood_groups_per_s": done / flood_end,
        # both tenants' groups answered while the flood lasted: the rows the robot's groups take from the
        # flood under fair queueing are the flood's loss, not the fleet's
        "both_groups_per_s": (done + robots_done) / flood_end,
        "flood_wall_s": flood_end,
        "robot_sent": len(raw["robot"]),
        "statuses": statuses,
        "wrong_results": wrong,
    }


def run_fairness(smoke: bool, progress=None, arms_run=ARMS) -> dict:
    from candidate_scheduler.service.client import synthetic_image
    from candidate_scheduler.service.keys import add_key, init_dir

    flood, unloaded = (200, 8) if smoke else (2000, 30)
    image = synthetic_image(SIDE, SIDE, seed=13)
    work = Path(tempfile.mkdtemp(prefix="cs-fairness-"))
    keys_dir = work / "keys"
    init_dir(keys_dir)
    add_key(keys_dir, "rl-job", "client", "rl")
    add_key(keys_dir, "robot", "client", "robots")
    arms = []
    for name, flags in arms_run:
        with Launcher(work / "logs") as launcher:
            handle = launcher.scheduler("--curve-dir", str(keys_dir), "--max-queued-groups", "50000", *flags,
                                        name=f"scheduler-{name.replace(' ', '').replace(',', '-')}")
            for _ in range(WORKERS):
                launcher.worker(handle, "null", CAPACITY, "--curve-dir", str(keys_dir), step_delay=STEP_S)
            handle.wait_workers(WORKERS, timeout_s=120)
            pids = {"scheduler": [handle.proc.pid], "workers": [w.pid for w in handle.workers]}
            before = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}
            client_before = resource.getrusage(resource.RUSAGE_SELF)
            started = time.perf_counter()
            raw = asyncio.run(_arm(handle, keys_dir, flood, unloaded, image))
            wall = time.perf_counter() - started
            client_after = resource.getrusage(resource.RUSAGE_SELF)
            cores = {k: (sum(cpu_s(p) for p in v) - before[k]) / wall for k, v in pids.items()}
            cores["client"] = (client_after.ru_utime + client_after.ru_stime - client_before.ru_utime
                               - client_before.ru_stime) / wall
            with handle.client() as admin:
                stats = admin.stats()
            margins = [w.get("prefetch_margin_s", 0.0) for w in stats["workers"].values()]
            arm = {"arm": name, "flags": list(flags), **_summary(raw, image), "cores": cores,
                   "staggered_starts": stats.get("stagger", {}).get("starts"), "prefetch_margin_s": margins}
            arms.append(arm)
            if progress is not None:
                progress(arm)
    return {"arms": arms, "flood": flood, "workers": WORKERS, "capacity": CAPACITY, "steps": STEPS,
            "step_s": STEP_S, "robot_every_s": B_EVERY_S}


def _reference(arms: list[dict], arm: dict, key: str = "flood_groups_per_s") -> float | None:
    """The flood's throughput (`key`) first come first served with prefetch at once, in the arm's batching mode."""
    name = "fifo, step, prefetch at once" if "step" in arm["arm"] else "fifo, prefetch at once"
    return next((b.get(key) for b in arms if b["arm"] == name), None)


def _ratio(a, b):
    return None if a is None or not b else a / b


def _x(value, spec: str = ".0f") -> str:
    return "n/a" if value is None else format(value, spec)


def report(result: dict) -> str:
    meta = result["meta"]
    lines = [
        "# Fairness: one tenant floods, another sends a group every 100 ms",
        "",
        f"Run {meta['created']} at `{meta['git']}`, {meta['cpu_count']} CPUs, {meta['wall_s']:.0f} s"
        f"{' (smoke)' if meta['smoke'] else ''}. {result['workers']} null workers of {result['capacity']} rows, "
        f"{result['steps']} steps of {result['step_s'] * 1e3:.0f} ms (a batch: "
        f"{result['steps'] * result['step_s'] * 1e3:.0f} ms); tenant `rl` floods {result['flood']} one-candidate "
        f"groups at once; tenant `robots` sends one every {result['robot_every_s'] * 1e3:.0f} ms, alone first, "
        "then during the flood. Latency is receipt to reply at the scheduler.",
        "",
        "| arm | robot alone p50 / p99 (ms) | robot under flood p50 / p99 (ms) | p99 / alone p50 | flood groups/s "
        "| flood vs fifo at once | both tenants vs fifo at once | CPU: scheduler / workers / client "
        "| staggered starts | wrong |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in result["arms"]:
        fifo = _reference(result["arms"], a)
        alone, under, cores = a["robot_unloaded_ms"], a["robot_under_flood_ms"], a["cores"]
        lines.append(
            f"| {a['arm']} | {_x(alone['p50'])} / {_x(alone['p99'])} | {_x(under['p50'])} / {_x(under['p99'])} "
            f"(n={under['n']}) | {_x(_ratio(under['p99'], alone['p50']), '.2f')}x | {a['flood_groups_per_s']:.0f} | "
            f"{_x(_ratio(a['flood_groups_per_s'], fifo), '.3f')} | "
            f"{_x(_ratio(a.get('both_groups_per_s'), _reference(result['arms'], a, 'both_groups_per_s')), '.3f')} | "
            f"{cores['scheduler']:.2f} / {cores['workers']:.2f} / "
            f"{cores['client']:.2f} | {_x(a.get('staggered_starts'), 'd')} | {a['wrong_results']} |")
    lines += ["", "Targets (issue 22): with fair queueing the robot's p99 <= 2x its unloaded latency; the flooding "
              "tenant loses <= 5% of its throughput (flood vs fifo at once >= 0.95 in the fair arms: against first come "
              "first served with prefetched work sent at once, the most it gets; a step arm is compared with the step "
              "one). Under fair queueing the robot's groups take rows from the flood while it lasts (about 70 of "
              "2,070): 'both tenants' counts both tenants' groups done meanwhile, the fleet's throughput. Every `done` "
              "action was checked against the null model's answer for its seeds (wrong).", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for a in result["arms"]:
        series = a["robot_under_flood_series"]
        ax.plot([s for s, _ in series], [v * 1e3 for _, v in series], marker=".", label=a["arm"])
    alone = result["arms"][0]["robot_unloaded_ms"]["p50"]
    ax.axhline(alone, color="grey", linestyle=":", label="robot alone, p50")
    ax.axhline(2 * alone, color="red", linestyle="--", label="target: 2x alone")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the flood began")
    ax.set_ylabel("robot group: receipt to reply (ms)")
    ax.set_title(f"A flood of {result['flood']} groups from another tenant")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def run_fairness_bench(out_dir, *, smoke: bool = False, plot_it: bool = True, ablations: bool = False) -> dict:
    from tqdm import tqdm

    started, load_before = time.perf_counter(), loadavg()
    arms = ARMS if ablations else DEFAULT_ARMS
    bar = tqdm(total=len(arms), desc="fairness", unit="arm", file=sys.stderr, dynamic_ncols=True)
    try:
        result = run_fairness(smoke, lambda arm: (bar.set_description(f"fairness: {arm['arm']}"), bar.update(1)),
                              arms)
    finally:
        bar.close()
    result["meta"] = {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git": git_rev(),
                      "smoke": smoke, "cpu_count": os.cpu_count(), "wall_s": time.perf_counter() - started,
                      "loadavg_start": load_before, "loadavg_end": loadavg()}
    out = Path(out_dir) / ("fairness_smoke" if smoke else "")
    out.mkdir(parents=True, exist_ok=True)
    (out / "fairness.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "fairness.md").write_text(report(result))
    files = [str(out / "fairness.json"), str(out / "fairness.md")]
    if plot_it:
        files.append(plot(result, out / "fairness.png"))
    print(f"fairness bench: {result['meta']['wall_s']:.0f} s; wrote {', '.join(files)}")
    return result


# ---- the targets, run again: the tail of ~70 robot groups moves from run to run ----------------------------

TARGET_ARMS = ("fair", "fifo, prefetch at once", "fair, step", "fifo, step, prefetch at once", "fair, no stagger")


def targets(arms: list[dict]) -> dict:
    """Per fair arm (dispatch, step): the robot's p99 over its unloaded p50, and the flood against fifo."""
    out = {}
    for a in arms:
        if a["arm"].startswith("fair") and a["arm"] in TARGET_ARMS:
            out[a["arm"]] = {"p99_over_alone": _ratio(a["robot_under_flood_ms"]["p99"], a["robot_unloaded_ms"]["p50"]),
                             "flood_vs_fifo_at_once": _ratio(a["flood_groups_per_s"], _reference(arms, a)),
                             "wrong_results": a["wrong_results"]}
    return out


def run_repeats_bench(out_dir, repeats: int) -> dict:
    """`bench --fairness --fairness-repeats N`: the arms the targets compare, N runs more."""
    from tqdm import tqdm

    started = time.perf_counter()
    arms = tuple(a for a in ARMS if a[0] in TARGET_ARMS)
    bar = tqdm(total=repeats * len(arms), desc="fairness repeats", unit="arm", file=sys.stderr, dynamic_ncols=True)
    try:
        runs = [targets(run_fairness(False, lambda _arm: bar.update(1), arms)["arms"]) for _ in range(repeats)]
    finally:
        bar.close()
    result = {"runs": runs, "meta": {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                                     "git": git_rev(), "cpu_count": os.cpu_count(),
                                     "wall_s": time.perf_counter() - started, "loadavg_end": loadavg()}}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fairness_repeats.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "fairness_repeats.md").write_text(report_repeats(result))
    print(f"fairness repeats: {result['meta']['wall_s']:.0f} s; wrote {out / 'fairness_repeats.md'}")
    return result


def report_repeats(result: dict) -> str:
    meta = result["meta"]
    names = [a for a in TARGET_ARMS if a.startswith("fair")]
    lines = ["# Fairness targets, run again", "",
             f"Run {meta['created']} at `{meta['git']}`, {meta['cpu_count']} CPUs, {meta['wall_s']:.0f} s: "
             f"{len(result['runs'])} runs of the arms the targets compare (the setting of fairness.md), "
             "each cell: p99 / alone p50, and the flood vs fifo at once.", "",
             "| run | " + " | ".join(names) + " | wrong |", "|---" * (len(names) + 2) + "|"]
    for i, run in enumerate(result["runs"], 1):
        cells = [f"{_x(run.get(n, {}).get('p99_over_alone'), '.2f')}x, "
                 f"{_x(run.get(n, {}).get('flood_vs_fifo_at_once'), '.3f')}" for n in names]
        lines.append(f"| {i} | " + " | ".join(cells) + f" | {sum(a.get('wrong_results', 0) for a in run.values())} |")
    lines += ["", "Targets (issue 22): p99 / alone p50 <= 2x; flood vs fifo at once >= 0.95.", ""]
    return "\n".join(lines)
