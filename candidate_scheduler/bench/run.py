"""The method benchmark's run: start the services, load the in-process pipeline, run every shape and
the null worker, and collect the settings (`meta`) and the targets."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from candidate_scheduler.bench.common import (
    DEFAULT_MODEL,
    DEFAULT_OUT,
    PROMPT,
    ensure_model,
    git_rev,
    loadavg,
    package_version,
)
from candidate_scheduler.bench.conditioning import conditioning_reuse
from candidate_scheduler.bench.inprocess import quiet_logs, quiet_sglang
from candidate_scheduler.bench.memory import MemoryProbe
from candidate_scheduler.bench.methods import Bench
from candidate_scheduler.bench.null_worker import null_worker_bench, pure_admission
from candidate_scheduler.bench.settings import (
    BASE_SEED,
    METHODS,
    NS_FULL,
    NS_SMOKE,
    NULL_CAPACITY,
    NULL_COUNT,
    NULL_GROUPS,
    REDUCER,
    REPEATS_FULL,
    SHAPES,
    WORKER_CAPACITY,
)
from candidate_scheduler.bench.shape import run_shape
from candidate_scheduler.bench.targets import targets
from candidate_scheduler.service.launcher import Launcher


def options(args) -> dict:
    smoke = bool(getattr(args, "smoke", False))
    repeats = getattr(args, "repeats", None)
    device = getattr(args, "device", "cpu") or "cpu"
    # On CPU the large shape measures sglang's bf16 VAE encode of each new 256x256 observation (4-5 s
    # per group on these AVX-512-less cores, the same in every method) and would take about an hour:
    # `--shapes small large` still runs it.
    default = ["small"] if smoke or device == "cpu" else list(SHAPES)
    shapes = getattr(args, "shapes", None) or default
    ns = tuple(getattr(args, "ns", None) or (NS_SMOKE if smoke else NS_FULL))
    return {
        "smoke": smoke,
        "model": str(Path(getattr(args, "model", None) or DEFAULT_MODEL).expanduser().resolve()),
        "device": device,
        "out": Path(getattr(args, "out", None) or DEFAULT_OUT),
        "shapes": shapes,
        "ns": ns,
        "repeats": {s: (1 if smoke else int(repeats or REPEATS_FULL[s])) for s in shapes},
        "null_bursts": 1 if smoke else 3,
        "plots": not getattr(args, "no_plots", False),
        "main_thread": bool(getattr(args, "main_thread", False)),
        "sglang_cache": getattr(args, "sglang_cache", None) or "text",
    }


def run(args) -> tuple[dict, dict]:
    from tqdm import tqdm

    opts = options(args)
    t_start = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ensure_model(opts["model"])
    ns, shapes, device = opts["ns"], opts["shapes"], opts["device"]
    log_dir = Path(tempfile.mkdtemp(prefix="cs-bench-"))
    per_shape_units = {s: len(ns) * len(METHODS) * (opts["repeats"][s] + (1 if opts["smoke"] else 2)) for s in shapes}
    total_units = 2 + sum(per_shape_units.values()) + 1 + 1 + opts["null_bursts"] + 1
    progress = tqdm(total=total_units, desc="starting", unit="run", file=sys.stderr, dynamic_ncols=True,
                    mininterval=0.5)
    launcher = Launcher(log_dir)
    bench = None
    load_before = loadavg()
    ok = False
    try:
        # The worker process loads its model while this process imports sglang: the two overlap.
        model_service = launcher.scheduler(name="model-scheduler")
        launcher.worker(model_service, "cosmos3", WORKER_CAPACITY, model=opts["model"], device=device)
        null_service = launcher.scheduler(name="null-scheduler")
        launcher.worker(null_service, "null", NULL_CAPACITY, device=device)
        progress.set_description("loading sglang + the worker")
        quiet_logs()
        from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

        # the conditioning cache as a worker has it (its default size): the instruction's text K/V is
        # reused across groups, as sglang's own cross-request cache reuses it for (a) and (b)
        adapter = Cosmos3CandidateAdapter(opts["model"], device=device, max_candidates_per_batch=max(WORKER_CAPACITY, max(ns)),
                                          conditioning_cache_mb=256)
        adapter.server_args.batching_max_size = max(int(getattr(adapter.server_args, "batching_max_size", 1)), max(ns))
        quiet_sglang()
        progress.update(1)
        model_service.wait_workers(1, timeout_s=300, poll_s=0.2)
        progress.update(1)
        load_s = time.perf_counter() - t_start
        phases = {"load_s": load_s}
        import torch

        bench = Bench(adapter, model_service, device, main_thread=opts["main_thread"], sglang_cache=opts["sglang_cache"])
        mem = MemoryProbe(device)
        shape_results = {}
        for shape_name in shapes:
            shape_results[shape_name] = run_shape(bench, mem, shape_name, ns, opts["repeats"][shape_name], progress,
                                                   separate_memory_pass=not opts["smoke"])

        phases["shapes_s"] = time.perf_counter() - t_start - load_s
        progress.set_description("conditioning cache")
        bench.set_shape(SHAPES["small"])
        cache = bench.compute.call(conditioning_reuse, bench, (1, 8), 2 if opts["smoke"] else 5) \
            if bench.compute is not None else conditioning_reuse(bench, (1, 8), 2 if opts["smoke"] else 5)
        progress.set_description("null worker")
        t_null = time.perf_counter()
        null_service.wait_workers(1, timeout_s=60, poll_s=0.2)
        progress.update(1)
        null = null_worker_bench(null_service, NULL_GROUPS, NULL_COUNT, opts["null_bursts"], progress)
        null["pure"] = pure_admission(NULL_GROUPS, NULL_COUNT, NULL_CAPACITY, rounds=5)
        progress.update(1)
        phases["null_s"] = time.perf_counter() - t_null
        progress.set_description("done")
        meta = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "git": git_rev(),
            "smoke": opts["smoke"],
            "device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": bench.torch_threads(),
            "in_process_calls": "main thread" if opts["main_thread"] else "dedicated compute thread (as the worker)",
            "sglang_conditioning_cache": opts["sglang_cache"],
            "torch": torch.__version__,
            "sglang": package_version("sglang"),
            "python": platform.python_version(),
            "model": opts["model"],
            "prompt": PROMPT,
            "base_seed": BASE_SEED,
            "reducer": REDUCER,
            "worker_capacity": WORKER_CAPACITY,
            "ns": list(ns),
            "shapes": {s: SHAPES[s] for s in shapes},
            "repeats": opts["repeats"],
            "phases": phases,
            "memory_kind": "cuda_max_allocated" if device.startswith("cuda") else "rss_peak",
        }
        result = {"meta": meta, "shapes": shape_results, "null_worker": null, "conditioning_cache": cache}
        result["targets"] = targets(result)
        meta["loadavg_start"], meta["loadavg_end"] = load_before, loadavg()
        meta["wall_s"] = time.perf_counter() - t_start
        ok = True
        return result, opts
    finally:
        progress.close()
        if bench is not None:
            bench.close()
        launcher.close(timeout_s=10)
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"\nbench failed; child logs in {log_dir}", file=sys.stderr)

