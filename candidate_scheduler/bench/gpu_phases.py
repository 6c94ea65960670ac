"""The phases of `make gpu-check` (gpu_check.py runs each in a child process with its own time cap).

Each phase takes the settings dict the parent wrote and returns a JSON-able dict:
- env: the device, the driver, torch, CUDA, sglang;
- ceiling: the device's GEMM rate and batch invariance at the full preset's dimensions (gpu_ceiling.py);
- cuda_imports (the CPU rehearsal only): gpu_rehearsal.py;
- probe: the tiny checkpoint on the device (does sglang's Cosmos3 run here at all), with the
  equivalence check at a small shape;
- equivalence: a group's candidates against sglang's pipeline run alone per seed, with CFG, as the
  worker runs them by default (on CUDA one candidate a transformer call) and on CUDA with the
  candidates batched in one call, with and without sglang's batch-invariant kernels; and where a
  group's device time goes (gpu_profile.py);
- methods: (a) sequential sglang, (c) the worker's group, (d) end to end through the scheduler, for
  each N, with peak device memory, and on CUDA (c) again with the candidates batched in one call
  ("c_batched_calls": what exactness costs); the step count is the largest that fits the phase's
  time, measured from a warm-up;
- load: a burst of policy groups at a policy shape under dispatch and under step batching.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from candidate_scheduler.bench.common import PROMPT, json_default, package_version
from candidate_scheduler.bench.gpu_profile import kernel_profile
from candidate_scheduler.bench.gpu_rehearsal import cuda_imports, uncovered_now
from candidate_scheduler.bench.settings import BASE_SEED

METHOD_ORDER = ("a_sequential", "c_worker_batch", "d_scheduler_e2e")


def _sampling(shape: dict, steps: int | None = None, guidance: float | None = None):
    from candidate_scheduler.core.work import SamplingSpec

    return SamplingSpec(height=int(shape["height"]), width=int(shape["width"]),
                        steps=int(steps or shape["steps"]), guidance_scale=float(guidance or shape.get("guidance", 1.0)))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def env(settings: dict) -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "sglang": package_version("sglang"),
           "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
           "cpu_count": os.cpu_count(), "sgl_kernel": _sgl_kernel_kind()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(device_name=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}")
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        out["nvidia_smi"] = line.stdout.strip() or line.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["nvidia_smi"] = f"unavailable: {exc}"
    return out


def _sgl_kernel_kind() -> str:
    try:
        import sgl_kernel
    except ImportError:
        return "absent"
    return "stand-in (scripts/gpu_shims)" if getattr(sgl_kernel, "STAND_IN", False) else package_version("sgl-kernel")


def _adapter(settings: dict, model: str, capacity: int):
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    t0 = time.perf_counter()
    adapter = Cosmos3CandidateAdapter(model, device=settings["device"], max_candidates_per_batch=capacity,
                                      conditioning_cache_mb=256, call_rows=settings.get("call_rows", "auto"))
    adapter.server_args.batching_max_size = max(int(getattr(adapter.server_args, "batching_max_size", 1)), capacity)
    if settings.get("rehearse_cuda_text"):
        adapter.text.by_request_rows = True
    return adapter, time.perf_counter() - t0


def group_work(sampling, n: int, request_id: str = "gpu-check-eq"):
    """One group of n candidates (the check's seeds) on a synthetic observation, as the worker gets it."""
    from candidate_scheduler.core import rng
    from candidate_scheduler.core.work import CandidateWork, GroupWork
    from candidate_scheduler.service.client import synthetic_image

    image = synthetic_image(sampling.height, sampling.width, seed=1)
    seeds = rng.candidate_seeds(BASE_SEED, n, "per_candidate")
    return GroupWork(request_id=request_id, images=image[None], prompts=[PROMPT], sampling=sampling,
                     candidates=[CandidateWork(i, s) for i, s in enumerate(seeds)])


def compare(adapter, sampling, n: int, device: str, alone: tuple[np.ndarray, float] | None = None) -> dict:
    """N candidates in one group (as many rows a transformer call as `adapter.call_rows` allows) against
    sglang's pipeline run alone for each seed; `alone`: those runs' actions and seconds, from a pass
    whose sglang side is the same (the adapter's calls do not change sglang's)."""
    from candidate_scheduler.worker.cosmos3 import sglang_reference_actions

    item = group_work(sampling, n)
    image, seeds = item.images[0], [c.seed for c in item.candidates]
    t0 = time.perf_counter()
    outputs, _report = adapter.run_batch([item])
    _sync(device)
    batched_s = time.perf_counter() - t0
    if outputs[0].status != "ok":
        raise RuntimeError(f"batched run failed: {outputs[0].error_code}: {outputs[0].error}")
    batched = np.asarray(outputs[0].actions, dtype=np.float64)[:, 0]
    if alone is None:
        t0 = time.perf_counter()
        runs = np.stack([sglang_reference_actions(adapter.pipeline, adapter.server_args, image, PROMPT, sampling, s)
                         for s in seeds]).astype(np.float64)
        _sync(device)
        alone = (runs, time.perf_counter() - t0)
    rule = adapter.capability().equivalence
    diff = np.abs(batched - alone[0])
    scale = float(np.max(np.abs(alone[0]))) or 1.0
    return {"n": n, "sampling": sampling.to_dict(), "seeds": list(seeds),
            "call_rows": adapter.call_rows or "all", "text_by_request_rows": adapter.text.by_request_rows,
            "max_abs_diff": float(diff.max()), "max_rel_diff": float(diff.max() / scale),
            "per_candidate_max_abs": [float(d.max()) for d in diff], "bitwise": bool(np.array_equal(batched, alone[0])),
            "bound": {"atol": rule.atol, "rtol": rule.rtol},
            "within_bound": bool(np.allclose(batched, alone[0], atol=rule.atol, rtol=rule.rtol)),
            "finite": bool(np.isfinite(batched).all() and np.isfinite(alone[0]).all()),
            "batched_s": batched_s, "alone_s": alone[1], "alone": alone}


def _public(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "alone"}


def probe(settings: dict) -> dict:
    adapter, load_s = _adapter(settings, settings["tiny_model"], 8)
    out = _public(compare(adapter, _sampling(settings["probe_shape"], guidance=settings["cfg_guidance"]), 4,
                          settings["device"]))
    out["load_s"] = load_s
    out["ops"] = os.environ.get("CANDIDATE_SCHEDULER_SGLANG_OPS", "shipped")
    # what sglang imported only while generating; the rehearsal must know it before a device does
    out["uncovered"] = uncovered_now()
    if settings["dry_run"] and out["uncovered"]:
        raise RuntimeError(f"imported while generating, absent on the lent machine: {out['uncovered']} "
                           "(carry them in scripts/gpu_wheels.txt or stand in for them in scripts/gpu_shims)")
    return out


def equivalence(settings: dict) -> dict:
    """The comparison as the worker runs by default (on CUDA one candidate a transformer call), then,
    where that is not one call for them all, with the candidates batched in one call, and on CUDA
    batched again with sglang's batch-invariant kernels (sglang.srt.batch_invariant_ops: Triton
    matmuls whose result for a row does not depend on the others, in place of cuBLAS) on both sides:
    is each way bitwise sglang alone, and at what cost."""
    adapter, load_s = _adapter(settings, settings["model"], 8)
    shape, device = settings["shape"], settings["device"]
    warm = _sampling(shape, steps=2, guidance=settings["cfg_guidance"])
    timed = _sampling(shape, steps=settings["equivalence_steps"], guidance=settings["cfg_guidance"])
    n = settings["equivalence_n"]
    compare(adapter, warm, n, device)  # the shapes of the timed pass, outside it
    # each timed pass pays its own observation encode (the warm-up and the profile use the same image)
    adapter.conditioning_cache.drop("vae")
    default = compare(adapter, timed, n, device)
    out = {**_public(default), "load_s": load_s}
    partial = Path(settings["partial_result"])
    # kept if what follows fails or overruns the phase's cap: the comparison is the phase's measurement
    partial.write_text(json.dumps({**out, "batch_invariant": {"error": "did not finish"}}, default=json_default))
    # the loaded model is here already: where one step's time goes, at the methods' shape (no CFG)
    steps = _sampling(shape, steps=2)
    try:
        out["profile"] = [kernel_profile(adapter, group_work(steps, k, f"gpu-check-profile-{k}"), device)
                          for k in settings["profile_ns"]]
    except Exception as exc:  # a profiler that cannot run here (no CUPTI, say) costs only its table
        out["profile_error"] = f"{type(exc).__name__}: {exc}"
    with adapter.with_call_rows(None):
        if out["call_rows"] == "all":
            out["batched_calls"] = {"skipped": "the default is one call for them all"}
        else:
            try:
                compare(adapter, warm, n, device)
                adapter.conditioning_cache.drop("vae")
                out["batched_calls"] = _public(compare(adapter, timed, n, device, alone=default["alone"]))
            except Exception as exc:  # beside the measurement: the default comparison stands
                out["batched_calls"] = {"error": f"{type(exc).__name__}: {exc}"}
            partial.write_text(json.dumps({**out, "batch_invariant": {"error": "did not finish"}},
                                          default=json_default))
        if not device.startswith("cuda"):
            out["batch_invariant"] = {"skipped": "not CUDA"}
            return out
        try:
            from sglang.multimodal_gen.runtime.cache.conditioning import invalidate_conditioning_caches
            from sglang.srt.batch_invariant_ops import disable_batch_invariant_mode, enable_batch_invariant_mode

            enable_batch_invariant_mode()
            try:
                # no conditioning computed with the default kernels on either side
                adapter.conditioning_cache.clear()
                invalidate_conditioning_caches()
                compare(adapter, warm, n, device)
                adapter.conditioning_cache.drop("vae")
                out["batch_invariant"] = _public(compare(adapter, timed, n, device))
            finally:
                disable_batch_invariant_mode()
        except Exception as exc:  # an experiment beside the measurement
            out["batch_invariant"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def choose_steps(per_candidate_step_s: float, budget_s: float, ns, methods: int, most: int, least: int = 2,
                 fixed_s: float = 0.0) -> int:
    """The most denoise steps (<= most) whose timed pass fits budget_s: every method runs every N once,
    each run pays `fixed_s` whatever its steps (a fresh observation's conditioning, the decode), and a
    candidate-step costs per_candidate_step_s whether batched or not (the bound when the device is
    saturated, so an over-estimate for batched methods)."""
    per_step = per_candidate_step_s * sum(ns) * methods
    if per_step <= 0:
        return most
    return int(max(least, min(most, (budget_s - fixed_s * len(ns) * methods) // per_step)))


def step_cost(short_s: float, long_s: float, short_steps: int, long_steps: int) -> tuple[float, float]:
    """(seconds a step, seconds a run pays besides its steps) from two runs of one candidate that differ
    only in their step count. The second H200 loan took a 2-step run's time over 2 as a step's: 142 ms
    against 79 ms, the run's fixed part counted as steps, and fitted 16 steps where about 30 would have fit
    (its timed runs took 90 s, and the phase ended 85 s inside its cap)."""
    per_step = max(0.0, (long_s - short_s) / max(1, long_steps - short_steps))
    if per_step == 0.0:  # timer noise on a fast device: no better than the short run's own average
        return short_s / max(1, short_steps), 0.0
    return per_step, max(0.0, short_s - short_steps * per_step)


def methods(settings: dict) -> dict:
    """(a), (c), (d) at one shape for every N, one timed run each after one warm-up per method."""
    from candidate_scheduler.bench.memory import MemoryProbe
    from candidate_scheduler.bench.methods import Bench
    from candidate_scheduler.service.launcher import Launcher

    device, ns, shape = settings["device"], list(settings["ns"]), settings["shape"]
    t_start = time.perf_counter()
    deadline = t_start + float(settings["phase_budget_s"])
    launcher = Launcher(Path(tempfile.mkdtemp(prefix="gpu-check-")), ready_timeout_s=120)
    bench = None
    try:
        service = launcher.scheduler(name="scheduler")
        launcher.worker(service, "cosmos3", max(16, max(ns)), "--call-rows", str(settings.get("call_rows", "auto")),
                        model=settings["model"], device=device)
        adapter, load_s = _adapter(settings, settings["model"], max(16, max(ns)))
        service.wait_workers(1, timeout_s=max(30.0, deadline - time.perf_counter()), poll_s=0.2)
        ready_s = time.perf_counter() - t_start
        bench = Bench(adapter, service, device)
        mem = MemoryProbe(device)
        warm_steps = int(settings["warmup_steps"])
        bench.set_shape({**shape, "steps": warm_steps})
        # one candidate a call (the worker's default on CUDA): (c) with them batched too, beside it
        batched_too = adapter.call_rows is not None
        warm = {}
        for method, n in (("c_worker_batch", max(ns)), ("a_sequential", 1), ("d_scheduler_e2e", 1)):
            bench.fresh_conditioning()
            warm[f"{method}/N={n}"] = bench.run(method, n).latency_s
        if batched_too:  # its kernels and allocations at the largest N, outside the timed runs
            bench.fresh_conditioning()
            with adapter.with_call_rows(None):
                warm[f"c_batched_calls/N={max(ns)}"] = bench.run("c_worker_batch", max(ns)).latency_s
        bench.set_shape({**shape, "steps": 2 * warm_steps})
        bench.fresh_conditioning()
        warm[f"a_sequential/N=1/{2 * warm_steps} steps"] = bench.run("a_sequential", 1).latency_s
        per_candidate_step, fixed = step_cost(warm["a_sequential/N=1"], warm[f"a_sequential/N=1/{2 * warm_steps} steps"],
                                              warm_steps, 2 * warm_steps)
        left = deadline - time.perf_counter() - float(settings["reserve_s"])
        steps = choose_steps(per_candidate_step, left, ns, len(METHOD_ORDER) + batched_too, int(shape["steps"]),
                             fixed_s=fixed)
        bench.set_shape({**shape, "steps": steps})
        rows = []
        for k, n in enumerate(ns):
            bench.set_image(100 + n)
            order = METHOD_ORDER[k % 3:] + METHOD_ORDER[:k % 3]
            runs = {}
            for method in order:
                bench.fresh_conditioning()
                # this process's peak (CUDA: max allocated; CPU: RSS); (d)'s model runs in the worker
                token = None if method == "d_scheduler_e2e" else mem.begin()
                run = bench.run(method, n)
                peak = None if token is None else mem.end(token)["peak_bytes"] / 2**30
                runs[method] = run
                rows.append(_method_row(method, n, run, peak))
            if batched_too:
                bench.fresh_conditioning()
                adapter.conditioning_cache.drop("vae")  # its own observation encode, as (c) paid
                with adapter.with_call_rows(None):
                    token = mem.begin()
                    runs["c_batched_calls"] = run = bench.run("c_worker_batch", n)
                    rows.append(_method_row("c_batched_calls", n, run, mem.end(token)["peak_bytes"] / 2**30))
            ref = runs["a_sequential"].actions.astype(np.float64)
            for row in rows[-len(runs):]:
                row["max_abs_vs_a"] = float(np.max(np.abs(runs[row["method"]].actions.astype(np.float64) - ref)))
        return {"shape": {**shape, "steps": steps}, "steps_most": int(shape["steps"]), "warmup_steps": warm_steps,
                "call_rows": adapter.call_rows or "all",
                "warmup_s": warm, "per_candidate_step_s": per_candidate_step, "fixed_per_run_s": fixed,
                "load_s": load_s, "ready_s": ready_s,
                "rows": rows, "wall_s": time.perf_counter() - t_start}
    finally:
        if bench is not None:
            bench.close()
        launcher.close(timeout_s=10)


def _method_row(method: str, n: int, run, peak_gib: float | None) -> dict:
    return {"method": method, "n": n, "latency_s": run.latency_s, "forwards": run.forwards, "peak_gib": peak_gib,
            **{k: v for k, v in (run.extra or {}).items() if isinstance(v, (int, float, str))}}


def _burst(service, shape: dict, groups: int, count: int, timeout_s: float, tag: str) -> dict:
    """Every group at once, each with its own observation; groups/s and latency as the client saw them."""
    from candidate_scheduler import protocol
    from candidate_scheduler.bench.fleet import drive
    from candidate_scheduler.service.client import make_request, synthetic_image

    side_h, side_w = int(shape["height"]), int(shape["width"])
    frames = [protocol.encode(protocol.Kind.SUBMIT, make_request(
        synthetic_image(side_h, side_w, seed=1000 + i), PROMPT, request_id=f"{tag}-{i}", count=count,
        seed=BASE_SEED + 100 * i, reducer="mean", height=side_h, width=side_w, steps=int(shape["steps"])))
        for i in range(groups)]
    run = drive(service.request, frames, None, timeout_s=timeout_s)
    replies = run["replies"]
    statuses: dict[str, int] = {}
    for _at, reply in replies.values():
        statuses[reply.status] = statuses.get(reply.status, 0) + 1
    wall = max(at for at, _r in replies.values()) - run["t0"]
    latency = np.asarray([at - run["sent"][i] for i, (at, _r) in replies.items()]) * 1e3
    forwards = [float(r.metrics.get("physical_forwards") or 0) for _at, r in replies.values()]
    return {"groups": groups, "count": count, "statuses": statuses, "wall_s": wall,
            "groups_per_s": statuses.get("done", 0) / wall, "candidates_per_s": statuses.get("done", 0) * count / wall,
            "latency_ms": {"p50": float(np.percentile(latency, 50)), "p99": float(np.percentile(latency, 99))},
            "forwards_per_group_median": float(np.median(forwards))}


def load(settings: dict) -> dict:
    """A burst of policy groups at a policy shape under each batching mode: one device worker per mode
    (batching is the scheduler's flag; a fresh worker keeps the two arms apart), half the phase each."""
    from candidate_scheduler.service.launcher import Launcher

    shape, device = settings["load_shape"], settings["device"]
    t_start = time.perf_counter()
    out = {"shape": shape, "modes": {}}
    for k, mode in enumerate(("dispatch", "step")):
        deadline = t_start + float(settings["phase_budget_s"]) * (k + 1) / 2
        with Launcher(Path(tempfile.mkdtemp(prefix=f"gpu-check-load-{mode}-")), ready_timeout_s=120) as launcher:
            service = launcher.scheduler("--batching", mode, name=f"scheduler-{mode}")
            launcher.worker(service, "cosmos3", 16, "--call-rows", str(settings.get("call_rows", "auto")),
                            model=settings["model"], device=device)
            t0 = time.perf_counter()
            service.wait_workers(1, timeout_s=max(10.0, deadline - t0 - 10), poll_s=0.2)
            ready_s = time.perf_counter() - t0
            result = _burst(service, shape, int(settings["load_groups"]), int(settings["load_count"]),
                            max(10.0, deadline - time.perf_counter()), f"load{mode}")
            out["modes"][mode] = {**result, "worker_ready_s": ready_s}
    return out


def ceiling(settings: dict) -> dict:
    """The device's GEMM rate and batch invariance at the full preset's dimensions (gpu_ceiling.py)."""
    from candidate_scheduler.bench.gpu_ceiling import measure

    if settings["dry_run"]:
        return measure(True)
    # kept if the second pass, with sglang's batch-invariant kernels (Triton builds), overruns the cap
    Path(settings["partial_result"]).write_text(json.dumps(measure(False, invariant_kernels=False)))
    return measure(False)


PHASES = {"env": env, "cuda_imports": cuda_imports, "ceiling": ceiling, "probe": probe, "equivalence": equivalence, "methods": methods, "load": load}
