"""Per-step overhead of the Cosmos3 running batch against the bare transformer forward.

One group of N candidates (or several, sharing one cohort) joins an empty running batch and runs
`steps` denoise steps. For every step we time `adapter.step(groups)`, the transformer forward inside
it (pre/post hooks), and right after the step the bare forward on the same inputs: `transformer(**kwargs)` called directly with the kwargs
the step's forward got (its UND K/V is cached under the same key, as in the step). Reported are
medians over the steps:

- step_ms: the whole step (cohort planning, row tensors, forward, CFG, both solvers, re-blend);
- forward_in_step_ms: the transformer forward inside the step;
- outside_forward_ms: step minus the forward inside it (what the step adds around the model), split
  into solvers_ms (the groups' own UniPC `step` calls: sglang's arithmetic, which must stay as it is)
  and bookkeeping_ms (everything else: cohorts, row tensors, CFG combine, masks, re-blend, hooks);
- bare_forward_ms: the bare forward; overhead_ms = median(step - bare) over paired steps.

Everything runs on one dedicated thread, like the worker's compute thread (bench/README.md: on these
shared CPUs torch work issued from a process's main thread can stall at OpenMP barriers).

    python -m candidate_scheduler.bench.step_profile [--model DIR] [--steps 60] [--n 1 8] [--groups G]
        [--sharing on|off|both] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import DEFAULT_MODEL
from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

WARMUP_STEPS = 3


def profile_step(adapter, steps: int = 60, n: int = 1, height: int = 64, width: int = 64,
                 guidance: float = 1.0, groups: int = 1, share_solvers: bool = True) -> dict:
    """Time `steps` steps of `groups` groups of n candidates each, sharing one cohort (plus untimed
    warm-up steps); medians in ms. Without CFG only: the bare-forward replay runs the step's one forward,
    and a CFG step may run two (serial when the cond and uncond token lengths differ). The groups start
    together, so they are in lockstep: `share_solvers` says whether their solvers step together."""
    if guidance > 1.0:
        raise ValueError("step_profile times steps without CFG (guidance <= 1); a CFG step may run two forwards")
    import torch
    from sglang.multimodal_gen.runtime.managers.forward_context import set_forward_context

    transformer = adapter.transformer
    sampling = SamplingSpec(height=height, width=width, steps=steps + WARMUP_STEPS, guidance_scale=guidance)
    image = np.random.default_rng(0).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    items = [GroupWork(f"step-profile-{k}", image, ["pick up the red cube"], sampling,
                       [CandidateWork(i, seed=1000 + 100 * k + i) for i in range(n)]) for k in range(groups)]
    captured: dict = {}
    inside: list[float] = []
    started = [0.0]

    def before(_module, _args, kwargs):
        captured.clear()
        captured.update(kwargs)
        started[0] = time.perf_counter()

    def after(_module, _args, _kwargs, _output):
        inside.append(time.perf_counter() - started[0])

    solver_s = [0.0]

    def timed(step_fn):
        def step(*args, **kwargs):
            t = time.perf_counter()
            try:
                return step_fn(*args, **kwargs)
            finally:
                solver_s[0] += time.perf_counter() - t

        return step

    shared_before, adapter.share_solvers = adapter.share_solvers, share_solvers
    running = [adapter.start(item) for item in items]
    for group in running:  # each group's own UniPC solvers (sglang's arithmetic, not ours to trim)
        for solver in (group.video_scheduler, group.action_scheduler):
            solver.step = timed(solver.step)
    rows = {"step": [], "forward_in_step": [], "solvers": [], "bare": []}
    handles = [transformer.register_forward_pre_hook(before, with_kwargs=True),
               transformer.register_forward_hook(after, with_kwargs=True)]
    try:
        for i in range(steps + WARMUP_STEPS):
            inside.clear()
            solver_s[0] = 0.0
            t0 = time.perf_counter()
            adapter.step(running)
            step_s = time.perf_counter() - t0
            forward_s = sum(inside)
            with torch.inference_mode(), set_forward_context(current_timestep=i, attn_metadata=None):
                # the step's proj_out layout rule, so the bare forward does the same arithmetic
                adapter.proj_out_contiguous = True
                t1 = time.perf_counter()
                transformer(**captured)
                bare_s = time.perf_counter() - t1
                adapter.proj_out_contiguous = False
            if i >= WARMUP_STEPS:
                rows["step"].append(step_s)
                rows["forward_in_step"].append(forward_s)
                rows["solvers"].append(solver_s[0])
                rows["bare"].append(bare_s)
    finally:
        for h in handles:
            h.remove()
        for group in running:
            adapter.release(group)
        adapter.share_solvers = shared_before
    ms = {k: [v * 1e3 for v in vals] for k, vals in rows.items()}
    step, inner, solvers, bare = ms["step"], ms["forward_in_step"], ms["solvers"], ms["bare"]
    overhead = [s - b for s, b in zip(step, bare)]
    return {
        "groups": groups, "n": n, "steps": steps, "height": height, "width": width, "guidance": guidance,
        "share_solvers": share_solvers,
        "step_ms": statistics.median(step),
        "forward_in_step_ms": statistics.median(inner),
        "outside_forward_ms": statistics.median([s - f for s, f in zip(step, inner)]),
        "solvers_ms": statistics.median(solvers),
        "bookkeeping_ms": statistics.median([s - f - v for s, f, v in zip(step, inner, solvers)]),
        "bare_forward_ms": statistics.median(bare),
        "overhead_ms": statistics.median(overhead),
        "overhead_pct": 100.0 * statistics.median(overhead) / statistics.median(bare),
    }


def on_compute_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) on a dedicated thread, as a worker's compute thread runs torch work; its
    result, or its exception re-raised here."""
    result: dict = {}

    def run():
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=run, name="step-profile-compute")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=60, help="timed steps (>= 50 for the README figure)")
    p.add_argument("--n", type=int, nargs="+", default=[1], help="candidates per group, one run each")
    p.add_argument("--groups", type=int, default=1, help="groups of N sharing one cohort")
    p.add_argument("--guidance", type=float, default=1.0, help="<= 1: CFG steps are not profiled")
    p.add_argument("--size", type=int, nargs=2, default=[64, 64], metavar=("H", "W"))
    p.add_argument("--sharing", choices=["on", "off", "both"], default="on",
                   help="solver steps of the groups (in lockstep) together or each its own; both: alternate off/on "
                        "--rounds times, side by side")
    p.add_argument("--rounds", type=int, default=3, help="alternations with --sharing both")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter
    from candidate_scheduler.worker.tiny_checkpoint import ensure_checkpoint

    model = ensure_checkpoint(Path(args.model)) if Path(args.model) == DEFAULT_MODEL else args.model
    adapter = on_compute_thread(Cosmos3CandidateAdapter, model, device=args.device)
    results = []
    arms = {"on": [True], "off": [False], "both": [False, True] * args.rounds}[args.sharing]
    for n, share in ((n, share) for n in args.n for share in arms):
        r = on_compute_thread(profile_step, adapter, steps=args.steps, n=n, height=args.size[0], width=args.size[1],
                       guidance=args.guidance, groups=args.groups, share_solvers=share)
        results.append(r)
        print(f"solver sharing {'on ' if share else 'off'} {r['groups']} group(s) x N={n} {r['height']}x{r['width']} g={r['guidance']}: step {r['step_ms']:.2f} ms, forward in step "
              f"{r['forward_in_step_ms']:.2f} ms, outside the forward {r['outside_forward_ms']:.2f} ms (UniPC solvers "
              f"{r['solvers_ms']:.2f}, the rest {r['bookkeeping_ms']:.2f}), bare forward "
              f"{r['bare_forward_ms']:.2f} ms, overhead {r['overhead_ms']:.2f} ms ({r['overhead_pct']:.1f}%)"
              f"  [median of {r['steps']} steps]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
