"""What `make gpu-check DRY_RUN=1` checks that a CPU run of the phases cannot: the CUDA import path.

The first lent H200 (2026-12-04) spent its 15 minutes on failures no CPU run could show: modules sglang
imports only on CUDA (sgl_kernel and its submodules), and distributions the lent image lacks (truststore,
IPython) or holds broken (an empty `sphinx` folder). This phase imports the worker's whole sglang chain
with sglang's platform forced to CUDA and torch told it has an H200 (imports only: nothing runs), through
the same stand-ins the device run uses, builds the worker's sglang ServerArgs as on the device, and
lists every distribution imported that is neither in the lent image (scripts/gpu_image_packages.txt)
nor carried (scripts/gpu_wheels.txt) nor stood in for (scripts/gpu_shims) nor ours. The dry run's probe
checks the same once a generation has run: sglang imports some modules only then (imageio_ffmpeg, on
the second loan).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# What the worker imports on its way to a running Cosmos3 pipeline (cosmos3_sglang.load_sglang_pipeline,
# then the model and the layers whose module-level imports differ on CUDA).
CHAIN = (
    "sglang.multimodal_gen.runtime.distributed.parallel_state",
    "sglang.multimodal_gen.runtime.pipelines_core",
    "sglang.multimodal_gen.runtime.server_args",
    "sglang.multimodal_gen.runtime.pipelines.cosmos3_pipeline",
    "sglang.multimodal_gen.runtime.models.dits.cosmos3video",
    "sglang.multimodal_gen.runtime.layers.layernorm",
    "sglang.multimodal_gen.runtime.layers.activation",
    "candidate_scheduler.worker.cosmos3",
    "sglang.srt.batch_invariant_ops",  # the equivalence phase's batch-invariant kernels (Triton)
)
# torch and its CUDA stack are the image's own (never carried: a gigabyte).
IMAGE_TORCH = ("torch", "torchvision", "triton", "nvidia-*", "cuda-*")
OURS = ("candidate-scheduler", "sglang")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: Path) -> set[str]:
    return {normalise(line.strip()) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def uncovered(imported: set[str], image: set[str], carried: set[str]) -> list[str]:
    """The imported distributions that would be missing on the lent machine (a stand-in covers one)."""
    stand_ins = {normalise(p.name) for p in (SCRIPTS / "gpu_shims").iterdir() if p.is_dir()}

    def covered(dist: str) -> bool:
        if dist in image or dist in carried or dist in stand_ins or dist in {normalise(o) for o in OURS}:
            return True
        return any(dist == p or (p.endswith("*") and dist.startswith(p[:-1])) for p in IMAGE_TORCH)

    return sorted(d for d in {normalise(i) for i in imported} if not covered(d))


def pretend_h200() -> None:
    """torch's answers about a device, as on the lent H200: enough for module-level code that sizes
    kernels by the device (sglang's Triton autotune configs) to import. Nothing may run on it."""
    import torch

    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                                  total_memory=140 * 2**30, L2_cache_size=60 * 2**20, warp_size=32,
                                  regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                  shared_memory_per_block_optin=232448, is_integrated=False)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    torch.cuda.get_device_name = lambda *a: props.name
    torch.cuda.get_device_properties = lambda *a: props
    torch.cuda.mem_get_info = lambda *a: (props.total_memory - 2**30, props.total_memory)


def imported_distributions() -> set[str]:
    from importlib.metadata import packages_distributions

    by_module = packages_distributions()
    tops = {name.split(".")[0] for name in list(sys.modules)}
    return {dist for top in tops for dist in by_module.get(top, ())}


def uncovered_now() -> list[str]:
    """What this process has imported so far that the lent machine would lack."""
    return uncovered(imported_distributions(), read_names(SCRIPTS / "gpu_image_packages.txt"),
                     read_names(SCRIPTS / "gpu_wheels.txt"))


def cuda_imports(settings: dict) -> dict:
    """The phase: import CHAIN as on CUDA; fails on an import error or an uncovered distribution."""
    os.environ["SGLANG_DIFFUSION_PLATFORM_OVERRIDE"] = "cuda"
    pretend_h200()
    for name in CHAIN:
        importlib.import_module(name)
    from sglang.multimodal_gen.runtime.platforms import current_platform

    from candidate_scheduler.worker.cosmos3_sglang import sglang_server_args

    # the worker's own ServerArgs, as on the device (sglang sizes its offload policy by the GPU's memory)
    args = sglang_server_args(settings["tiny_model"], "cuda")
    resident = not (args.dit_cpu_offload or args.text_encoder_cpu_offload or args.vae_cpu_offload
                    or args.dit_layerwise_offload)
    if not resident:
        raise RuntimeError("the worker's ServerArgs on CUDA would move a component off the device")
    dists = imported_distributions()
    missing = uncovered_now()
    if missing:
        raise RuntimeError(f"imported on the CUDA path, absent on the lent machine: {missing} "
                           "(add them to scripts/gpu_wheels.txt)")
    return {"platform": type(current_platform).__name__, "chain": list(CHAIN), "distributions": sorted(dists),
            "uncovered": missing, "task_type": str(args.pipeline_config.task_type), "resident": resident}
