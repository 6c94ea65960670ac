"""sglang's own Cosmos3 code, as the adapter and the tests reach it: loading a checkpoint with sglang's
loader, building a request exactly as sglang's action endpoint does, and running sglang's own pipeline
for one seed (the reference every candidate must match)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np

from candidate_scheduler.core.work import SamplingSpec


def prepare_environment() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_one_process_world(init, attempts: int = 5) -> None:
    """sglang's distributed init, on a fresh free port per attempt: the port is free when we pick it,
    but another process starting beside us (the load benchmark starts several) can bind it before
    torch's rendezvous store does (EADDRINUSE)."""
    for attempt in range(attempts):
        try:
            init(tp_size=1, sp_size=1)
            return
        except Exception as exc:  # noqa: BLE001 - torch.distributed.DistNetworkError, without importing it here
            if "EADDRINUSE" not in str(exc) or attempt == attempts - 1:
                raise
            os.environ["MASTER_PORT"] = str(free_port())


# "native": sglang's own PyTorch forms instead of its CUDA kernels (`make gpu-check`'s fallback on a
# machine where sglang's JIT kernels cannot be built, or not in the time a check has).
OPS_ENV = "CANDIDATE_SCHEDULER_SGLANG_OPS"


def _relu2_native(x, out=None, *, fast_math: bool = True):
    import torch

    y = torch.relu(x)
    return torch.mul(y, y, out=out)


def _native_ops() -> None:
    """Must run before the pipeline is built: a CustomOp picks its forward in __init__.

    Besides the CustomOps, Cosmos3's DiT and the Wan VAE call some of sglang's kernels directly on
    CUDA. The gated ones (can_use_*) fall back to PyTorch when a JIT build is refused, which sglang's
    own SGLANG_CRASH_ON_JIT_COMPILE does at once instead of compiling; the ungated ones are swapped
    for their PyTorch forms here (the VAE's are None on platforms without them, a path it has)."""
    from sglang.multimodal_gen.runtime.layers.custom_op import CustomOp
    from sglang.multimodal_gen.runtime.models.dits import cosmos3video
    from sglang.multimodal_gen.runtime.models.vaes import wanvae

    os.environ["SGLANG_CRASH_ON_JIT_COMPILE"] = "1"
    cosmos3video.relu2 = _relu2_native
    for name in ("cat_pad_channels_last_3d", "dup_up3d_add", "conv_bias_epilogue"):
        setattr(wanvae, name, None)
    if getattr(CustomOp, "_candidate_scheduler_native", False):
        return
    shipped = CustomOp.dispatch_forward

    def dispatch_forward(self):
        native = self._defined_forward("forward_native")
        return native if native is not None else shipped(self)

    CustomOp.dispatch_forward = dispatch_forward
    CustomOp._candidate_scheduler_native = True


def sglang_server_args(model_dir: str | os.PathLike, device: str = "cpu"):
    """sglang's ServerArgs for one worker's checkpoint (what load_sglang_pipeline builds it with)."""
    from sglang.multimodal_gen.runtime.server_args import ServerArgs

    model_dir = str(Path(model_dir).resolve())
    # Say "keep every component on the device" out loud: Cosmos3's task type is TI2V, for which sglang's
    # defaults move the DiT and the text pathway to the CPU between calls (unless its memory check
    # overrides them), which a serving worker must never pay.
    residency = {} if device == "cpu" else {"dit_cpu_offload": False, "text_encoder_cpu_offload": False,
                                             "vae_cpu_offload": False, "dit_layerwise_offload": False}
    server_args = ServerArgs.from_kwargs(model_path=model_dir, attention_backend="torch_sdpa", **residency)
    stats = Path(model_dir) / "action_stats.json"
    if stats.exists():
        server_args.pipeline_config.action_stats_path = str(stats)
    return server_args


def load_sglang_pipeline(model_dir: str | os.PathLike, device: str = "cpu"):
    """Load the checkpoint with sglang's own loader; returns (pipeline, server_args).

    One process holds one pipeline: sglang keeps global server args and a process-wide
    distributed group."""
    prepare_environment()
    # A worker is always a one-process torch.distributed world. Never inherit these from a parent:
    # a parent that loaded sglang itself holds its MASTER_PORT, and the child's rendezvous would fail.
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ["RANK"] = "0"
    os.environ["LOCAL_RANK"] = "0"
    os.environ["WORLD_SIZE"] = "1"
    if device == "cpu":
        # sglang picks its platform from what it can see; hide GPUs for an explicit cpu worker.
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

    from sglang.multimodal_gen.runtime.distributed.parallel_state import (
        maybe_init_distributed_environment_and_model_parallel,
    )
    from sglang.multimodal_gen.runtime.pipelines_core import build_pipeline
    from sglang.multimodal_gen.runtime.server_args import set_global_server_args

    server_args = sglang_server_args(model_dir, device)
    if os.environ.get(OPS_ENV) == "native":
        _native_ops()
    set_global_server_args(server_args)
    _init_one_process_world(maybe_init_distributed_environment_and_model_parallel)
    pipeline = build_pipeline(server_args)
    if os.environ.get("CANDIDATE_SCHEDULER_SGLANG_LOGS", "0") != "1":
        # sglang logs a warning per request for non-production resolutions; a worker serving many
        # small groups would drown its own log. CANDIDATE_SCHEDULER_SGLANG_LOGS=1 keeps them.
        import logging

        for name in list(logging.root.manager.loggerDict):
            if name.startswith("sglang"):
                logging.getLogger(name).setLevel(logging.ERROR)
    return pipeline, server_args


def build_sglang_request(server_args, image, prompt: str, sampling: SamplingSpec, seed: int, request_id: str = ""):
    """A Req exactly as sglang's action endpoint builds it for one observation and one seed."""
    from sglang.multimodal_gen.configs.sample.cosmos3 import Cosmos3SamplingParams
    from sglang.multimodal_gen.runtime.entrypoints.action.cosmos3 import (
        build_cosmos3_action_sampling_params,
    )
    from sglang.multimodal_gen.runtime.entrypoints.utils import prepare_request

    parameters = {
        "height": sampling.height,
        "width": sampling.width,
        "num_inference_steps": sampling.steps,
        "action_horizon": sampling.horizon,
        "guidance_scale": float(sampling.guidance_scale),
        "action_mode": sampling.action_mode,
        "domain_id": sampling.domain_id,
        "raw_action_dim": sampling.raw_action_dim,
        "fps": sampling.fps,
        "seed": int(seed),
    }
    if sampling.domain_name is not None:
        parameters["domain_name"] = sampling.domain_name
    payload = {"parameters": parameters, "request_id": request_id or None}
    sp = build_cosmos3_action_sampling_params(
        payload, {"image": image, "prompt": prompt}, server_args, Cosmos3SamplingParams
    )
    if sampling.negative_prompt is not None:
        sp.negative_prompt = sampling.negative_prompt
    return prepare_request(server_args, sp)


def sglang_reference_actions(pipeline, server_args, image: np.ndarray, prompt: str, sampling: SamplingSpec, seed: int) -> np.ndarray:
    """sglang's own pipeline, one request, one seed: the reference every candidate must match.
    Returns float32 [horizon, raw_action_dim]."""
    req = build_sglang_request(server_args, image, prompt, sampling, seed)
    out = pipeline.forward(req, server_args)
    if out.error:
        raise RuntimeError(out.error)
    return np.asarray(out.output[0]["actions"], dtype=np.float32)
