"""Cosmos3 candidate adapter: one candidate group (or several compatible ones) as one physical batch,
on sglang 0.5.23's own Cosmos3 model code.

What sglang's pipeline does for one request, and what we change for N candidates:

- Image preprocessing and tokenization run once per observation of a group (sglang's own stages).
- The observation's VAE latent is encoded once per observation and reused for every candidate (a memo
  around the latent stage's `_vae_encode`); the UND text pathway runs once per distinct text row and
  its K/V is expanded to the batch (a wrapper around `transformer.language_model`).
- Each candidate's starting noise comes from sglang's own `Cosmos3LatentPreparationStage` run at
  batch 1 with that candidate's generator, so it matches sglang's B=1 path draw for draw; the batch is
  the stack of those rows.
- The denoise loop mirrors `Cosmos3DenoisingStage._denoise_once` for the action-policy subset and calls
  the stage's own transformer/CFG helpers, so we own the step boundary (cancellation, counting) while
  the model math stays sglang's.
- `proj_out` gets the input layout sglang's own request would give it. At B > 1 sglang hands it a
  non-contiguous slice and `F.linear` then takes another kernel path (about 1 bf16 ulp apart when the
  layer has a non-zero bias). Where the reference forward runs at B = 1 (no CFG, serial CFG) our
  batched forwards make that input contiguous; in the batched-CFG path the reference forward itself
  runs at B = 2 on a non-contiguous slice, so ours is left as it is. The hook is inert outside our
  own forwards, so sglang's pipeline (the reference) runs unchanged.
- Decoding stops at the action tensor: slice to raw_action_dim and denormalise with the checkpoint's
  action stats (sglang's own functions); the video VAE decode never runs for policy actions.
"""

from __future__ import annotations

import copy
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from candidate_scheduler.core.work import (
    BatchReport,
    CandidateWork,
    GroupOutput,
    GroupWork,
    SamplingSpec,
)

# Per-row tensors of a running batch. When a group leaves mid-denoise every one of these is sliced
# (the pattern of sglang's batch_compaction: name every per-sample field explicitly).
ROW_TENSORS = (
    "latents",
    "action_latents",
    "velocity_mask",
    "condition_latents",
    "action_velocity_mask",
    "action_condition_latents",
    "action_domain_ids",
    "cond_text_ids",
    "cond_text_mask",
    "uncond_text_ids",
    "uncond_text_mask",
)
# Per-row state inside sglang's FlowUniPCMultistepScheduler that must follow the rows.
SCHEDULER_ROW_STATE = ("model_outputs", "last_sample")

MAX_OBSERVATIONS_PER_GROUP = 64


class ObservationError(ValueError):
    """A group's observation batch cannot run; `code` is a short stable machine code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def prepare_environment() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_sglang_pipeline(model_dir: str | os.PathLike, device: str = "cpu"):
    """Load the checkpoint with sglang's own loader; returns (pipeline, server_args).

    One process holds one pipeline: sglang keeps global server args and a process-wide
    distributed group."""
    prepare_environment()
    # A worker is always a one-process torch.distributed world. Never inherit these from a parent:
    # a parent that loaded sglang itself holds its MASTER_PORT, and the child's rendezvous would fail.
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
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
    from sglang.multimodal_gen.runtime.server_args import ServerArgs, set_global_server_args

    model_dir = str(Path(model_dir).resolve())
    server_args = ServerArgs.from_kwargs(model_path=model_dir, attention_backend="torch_sdpa")
    stats = Path(model_dir) / "action_stats.json"
    if stats.exists():
        server_args.pipeline_config.action_stats_path = str(stats)
    set_global_server_args(server_args)
    maybe_init_distributed_environment_and_model_parallel(tp_size=1, sp_size=1)
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


def validate_observations(images, prompts) -> tuple[np.ndarray, list[str]]:
    """Normalise one group's observations to uint8 [B, H, W, 3] and B prompts, or raise ObservationError.

    images: one [H, W, 3] array, a list of them, or a [B, H, W, 3] array. A str prompt broadcasts to
    every observation; a list pairs one-to-one."""
    if isinstance(images, (list, tuple)):
        if not images:
            raise ObservationError("empty_observations", "observation list is empty")
        arrays = [np.asarray(im) for im in images]
        for i, arr in enumerate(arrays):
            _check_image(arr, f"images[{i}]")
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            raise ObservationError(
                "observation_shape_mismatch",
                f"all observations of a group must share one shape, got {sorted(shapes)}",
            )
        batch = np.stack(arrays)
    else:
        arr = np.asarray(images)
        if arr.ndim == 4:
            for i in range(arr.shape[0]):
                _check_image(arr[i], f"images[{i}]")
            batch = arr
        else:
            _check_image(arr, "image")
            batch = arr[None]
    if batch.shape[0] == 0:
        raise ObservationError("empty_observations", "observation batch is empty")
    if batch.shape[0] > MAX_OBSERVATIONS_PER_GROUP:
        raise ObservationError(
            "too_many_observations",
            f"at most {MAX_OBSERVATIONS_PER_GROUP} observations per group, got {batch.shape[0]}",
        )
    n = batch.shape[0]
    if isinstance(prompts, str):
        prompt_list = [prompts] * n
    elif isinstance(prompts, (list, tuple)):
        if not all(isinstance(p, str) for p in prompts):
            raise ObservationError("bad_prompt", "prompt list must contain only strings")
        prompt_list = list(prompts)
        if len(prompt_list) == 1 and n > 1:
            prompt_list = prompt_list * n
        if len(prompt_list) != n:
            raise ObservationError(
                "prompt_count_mismatch",
                f"got {len(prompt_list)} prompt(s) for {n} observation(s); give one prompt, or one per observation",
            )
    else:
        raise ObservationError("bad_prompt", f"prompt must be a string or a list of strings, got {type(prompts).__name__}")
    return np.ascontiguousarray(batch), prompt_list


def _check_image(arr: np.ndarray, name: str) -> None:
    if arr.dtype != np.uint8:
        raise ObservationError("bad_dtype", f"{name} must be uint8, got {arr.dtype}")
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ObservationError("bad_shape", f"{name} must have shape [H, W, 3], got {list(arr.shape)}")
    if arr.shape[0] < 16 or arr.shape[1] < 16 or arr.shape[0] > 4096 or arr.shape[1] > 4096:
        raise ObservationError("bad_shape", f"{name} sides must be in [16, 4096], got {list(arr.shape[:2])}")


@dataclass
class _Row:
    group: int  # index into the items of the batch
    observation: int
    candidate: CandidateWork


@dataclass
class _PreparedGroup:
    item: GroupWork
    images: np.ndarray
    prompts: list[str]
    text: list[dict]  # per observation: cond/uncond ids and masks [1, S] and seq lens
    preprocessed: list  # per observation: preprocessed image tensor [1, 3, H, W]
    base_req: object  # a Req of observation 0, for scalar fields

    @property
    def text_lens(self) -> tuple[int, int]:
        return self.text[0]["cond_text_seq_len"], self.text[0]["uncond_text_seq_len"]


class Cosmos3CandidateAdapter:
    """Runs candidate groups of Cosmos3 action-policy requests as physical batches."""

    def __init__(self, model_dir: str | os.PathLike, device: str = "cpu", max_candidates_per_batch: int = 8):
        import torch

        self.model_dir = str(model_dir)
        self.device = device
        self.max_candidates_per_batch = int(max_candidates_per_batch)
        self.pipeline, self.server_args = load_sglang_pipeline(model_dir, device)
        self._torch = torch
        stages = {type(s).__name__: s for s in self.pipeline.stages}
        self.preprocess_stage = stages["Cosmos3ImagePreprocessStage"]
        self.tokenize_stage = stages["Cosmos3TokenizationStage"]
        self.latent_stage = stages["Cosmos3LatentPreparationStage"]
        self.timestep_stage = stages["Cosmos3TimestepPreparationStage"]
        self.denoise_stage = stages["Cosmos3DenoisingStage"]
        self.transformer = self.denoise_stage.transformer
        self.scheduler = self.denoise_stage.scheduler
        self.action_dim = int(self.transformer.action_dim)
        self.stats_path = self.server_args.pipeline_config.action_stats_path
        self.stats_dim = _stats_dim(self.stats_path)
        self._counts = {"forwards": 0, "text": 0, "vae": 0}
        self._vae_memo: dict = {}
        self._vae_key = None
        self._lock = threading.Lock()  # one batch at a time: the model holds per-request caches
        self._contiguous_proj_out = False  # set only around our forwards whose reference runs at B=1
        self._install_hooks()

    # ---- hooks on sglang's modules -------------------------------------------------------------
    def _install_hooks(self) -> None:
        torch = self._torch
        counts = self._counts

        def contiguous_input(_module, args):
            if not self._contiguous_proj_out:
                return None
            return (args[0].contiguous(),) + tuple(args[1:])

        self.transformer.proj_out.register_forward_pre_hook(contiguous_input)

        def count_forward(_module, _args, _kwargs):
            counts["forwards"] += 1

        self.transformer.register_forward_pre_hook(count_forward, with_kwargs=True)

        language_model = self.transformer.language_model
        original = language_model.forward

        def text_once(text_ids, text_mask, text_pos_ids, *args, **kwargs):
            # Rows of one group carry the same text; run each distinct row once, in first-seen order
            # (so a CFG batch [uncond, cond] runs exactly as sglang's own B=2 call), then expand.
            rows = torch.cat([text_ids, text_mask], dim=1)
            unique, inverse = _unique_rows(rows)
            counts["text"] += 1
            if len(unique) == rows.shape[0]:
                return original(text_ids, text_mask, text_pos_ids, *args, **kwargs)
            idx = torch.as_tensor(unique, device=text_ids.device)
            kv = original(text_ids[idx], text_mask[idx], text_pos_ids[:, idx], *args, **kwargs)
            gather = torch.as_tensor(inverse, device=text_ids.device)
            return [(k.index_select(0, gather), v.index_select(0, gather)) for k, v in kv]

        language_model.forward = text_once

        encode = self.latent_stage._vae_encode

        def encode_once(video):
            key = self._vae_key
            if key is None or key not in self._vae_memo:
                counts["vae"] += 1
                latent = encode(video)
                if key is None:
                    return latent
                self._vae_memo[key] = latent
            return self._vae_memo[key]

        self.latent_stage._vae_encode = encode_once

    # ---- capability --------------------------------------------------------------------------------
    def capability_dict(self) -> dict:
        """What this adapter declares (the fields of spec.ModelCapability)."""
        return {
            "model_name": "cosmos3",
            "action_tensor": "action_latents",
            "action_shape": [None, None],
            "action_dtype": "float32",
            "reduce_after_denormalize": True,
            "reducers": ["none", "mean", "median", "medoid"],
            "action_modes": ["policy"],
            "candidate_invariant": ["text_tokens", "und_text_kv", "image_latent", "timesteps", "rope"],
            "auxiliary_branch_required": True,  # video latents are denoised jointly with actions
            "max_candidates_per_batch": self.max_candidates_per_batch,
            "max_candidates_per_group": 256,
            "equivalence": {
                "dtype": "bfloat16",
                # bitwise on this CPU path; GPU kernels may reorder reductions (~1 bf16 ulp per step)
                "atol": 0.0 if self.device == "cpu" else 5e-2,
                "rtol": 0.0 if self.device == "cpu" else 5e-2,
                "bitwise_on_cpu": True,
            },
        }

    # ---- preparation ------------------------------------------------------------------------------
    def _prepare_group(self, item: GroupWork) -> _PreparedGroup:
        images, prompts = validate_observations(item.images, item.prompts)
        sampling = item.sampling
        if sampling.raw_action_dim > self.action_dim:
            raise ObservationError(
                "bad_raw_action_dim", f"raw_action_dim must be in [1, {self.action_dim}], got {sampling.raw_action_dim}"
            )
        if self.stats_dim is not None and sampling.raw_action_dim != self.stats_dim:
            # the checkpoint's action statistics denormalise exactly this many dims
            raise ObservationError(
                "bad_raw_action_dim",
                f"this checkpoint's action stats cover {self.stats_dim} action dims; raw_action_dim is {sampling.raw_action_dim}",
            )
        text, preprocessed = [], []
        base_req = None
        for b in range(images.shape[0]):
            req = build_sglang_request(self.server_args, images[b], prompts[b], sampling, 0, item.request_id)
            req = self.preprocess_stage.forward(req, self.server_args)
            req = self.tokenize_stage.forward(req, self.server_args)
            text.append(
                {k: req.extra[k] for k in ("cond_text_ids", "cond_text_mask", "uncond_text_ids", "uncond_text_mask",
                                            "cond_text_seq_len", "uncond_text_seq_len", "fps")}
            )
            preprocessed.append(req.preprocessed_image)
            base_req = base_req or req
        lens = {(t["cond_text_seq_len"], t["uncond_text_seq_len"]) for t in text}
        if len(lens) != 1:
            raise ObservationError(
                "prompt_length_mismatch",
                "prompts of one group must tokenize to the same length (Cosmos3 does not mask padded text K/V); "
                f"got lengths {sorted(l[0] for l in lens)}",
            )
        return _PreparedGroup(item, images, prompts, text, preprocessed, base_req)

    def _generator(self, cand: CandidateWork):
        torch = self._torch
        if cand.snapshot is not None:
            from candidate_scheduler.core import rng

            return rng.restore(cand.snapshot, self.device)
        return torch.Generator(device=self.device).manual_seed(int(cand.seed))

    # ---- the batch ---------------------------------------------------------------------------------
    def run_batch(
        self,
        items: list[GroupWork],
        should_drop: Callable[[], Iterable[str]] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> tuple[list[GroupOutput], BatchReport]:
        """Run compatible groups as physical batches. Bad groups get an error output; the others run.

        should_drop() is polled at every denoise step boundary and returns request ids to cancel;
        on_step(i) runs just before step i (a hook for tests and progress)."""
        with self._lock, self._torch.inference_mode():
            report = BatchReport()
            outputs: dict[int, GroupOutput] = {}
            prepared: dict[int, _PreparedGroup] = {}
            t0 = time.perf_counter()
            start_counts = dict(self._counts)
            self._vae_memo.clear()
            for gi, item in enumerate(items):
                try:
                    if not item.candidates:
                        raise ObservationError("no_candidates", "a group slice must carry at least one candidate")
                    prepared[gi] = self._prepare_group(item)
                except ObservationError as exc:
                    outputs[gi] = GroupOutput(item.request_id, "error", error=str(exc), error_code=exc.code)
                except (ValueError, TypeError) as exc:
                    outputs[gi] = GroupOutput(item.request_id, "error", error=str(exc), error_code="bad_request")
            report.condition_s += time.perf_counter() - t0
            # Groups share a forward only with equal sampling and equal text lengths; anything else runs
            # as its own physical batch, one after another.
            partitions: dict[tuple, list[int]] = {}
            for gi, pg in prepared.items():
                partitions.setdefault((pg.item.sampling.batch_key(), pg.text_lens), []).append(gi)
            for members in partitions.values():
                try:
                    outputs.update(self._run_partition([prepared[g] for g in members], members, report, should_drop, on_step))
                except ObservationError as exc:  # the request is wrong (e.g. its initial noise): no retry helps
                    for g in members:
                        outputs[g] = GroupOutput(items[g].request_id, "error", error=str(exc), error_code=exc.code)
                except Exception as exc:  # noqa: BLE001 - a model failure fails this batch's groups, not the worker
                    for g in members:
                        outputs[g] = GroupOutput(items[g].request_id, "error", error=f"{type(exc).__name__}: {exc}",
                                                 error_code="model_error")
            self._vae_memo.clear()
            report.transformer_forwards = self._counts["forwards"] - start_counts["forwards"]
            report.text_encodes = self._counts["text"] - start_counts["text"]
            report.vae_encodes = self._counts["vae"] - start_counts["vae"]
            report.peak_memory_bytes = self._peak_memory()
            return [outputs[i] for i in range(len(items))], report

    def _run_partition(self, groups: list[_PreparedGroup], indices: list[int], report: BatchReport, should_drop, on_step):
        torch = self._torch
        sa = self.server_args
        t0 = time.perf_counter()
        rows: list[_Row] = []
        per_row: dict[str, list] = {name: [] for name in ROW_TENSORS}
        generators: list = []  # per row, already past the initial-noise draws (rollout SDE noise continues them)
        first_req = None
        for local, pg in enumerate(groups):
            for b in range(pg.images.shape[0]):
                self._vae_key = (indices[local], b)
                for cand in pg.item.candidates:
                    req = copy.copy(pg.base_req)
                    req.extra = dict(pg.base_req.extra)
                    req.preprocessed_image = pg.preprocessed[b]
                    req.generator = self._generator(cand)
                    req = self.latent_stage.forward(req, sa)
                    if cand.initial_noise is not None:
                        self._use_initial_noise(req, cand.initial_noise)
                    generators.append(req.generator)
                    first_req = first_req or req
                    rows.append(_Row(local, b, cand))
                    per_row["latents"].append(req.latents)
                    per_row["action_latents"].append(req.action_latents)
                    for name in ("velocity_mask", "condition_latents", "action_velocity_mask",
                                 "action_condition_latents", "action_domain_ids"):
                        per_row[name].append(req.extra[name])
                    for name in ("cond_text_ids", "cond_text_mask", "uncond_text_ids", "uncond_text_mask"):
                        per_row[name].append(pg.text[b][name])
        self._vae_key = None
        state = {name: torch.cat(values, dim=0) for name, values in per_row.items()}
        first_req = self.timestep_stage.forward(first_req, sa)
        timesteps = first_req.timesteps
        video_scheduler = copy.deepcopy(self.scheduler)
        action_scheduler = copy.deepcopy(self.scheduler)
        action_scheduler.set_timesteps(len(timesteps), device=timesteps.device)
        report.condition_s += time.perf_counter() - t0
        report.rows += len(rows)

        t1 = time.perf_counter()
        sampling = groups[0].item.sampling
        cond_len, uncond_len = groups[0].text_lens
        extra = first_req.extra
        fps = extra.get("fps", 24.0)
        video_shape = extra["video_shape"]
        raw_dim = extra["raw_action_dim"]
        offset = extra.get("action_start_frame_offset", 1)
        action_fps = getattr(first_req.sampling_params, "action_fps", None)
        guidance = first_req.guidance_scale
        guidance_interval = getattr(first_req.sampling_params, "guidance_interval", None)
        stage = self.denoise_stage
        stage._share_vision_temporal_positions = bool(
            getattr(first_req.sampling_params, "share_vision_temporal_positions", True)
        )
        stage._extra_transformer_kwargs = {}
        cancelled: set[int] = set()
        self.transformer.reset_cache()
        timestep_values = timesteps.tolist()
        rollout = sampling.rollout
        keep_steps = set(range(len(timesteps)) if sampling.return_step_indices is None else sampling.return_step_indices)
        records: list[tuple[int, dict]] = []  # (step index, per-row rollout tensors)
        sigmas = action_scheduler.sigmas
        try:
            for i, t in enumerate(timesteps):
                if on_step is not None:
                    on_step(i)
                if should_drop is not None:
                    drop_ids = set(should_drop() or ())
                    leaving = {r.group for r in rows if groups[r.group].item.request_id in drop_ids}
                    if leaving:
                        cancelled |= leaving
                        keep = [k for k, r in enumerate(rows) if r.group not in leaving]
                        rows = [rows[k] for k in keep]
                        if not rows:
                            break
                        state = _keep_rows(state, keep, torch)
                        generators = [generators[k] for k in keep]
                        records = [(i_, _keep_record(rec, keep, torch)) for i_, rec in records]
                        _keep_scheduler_rows(video_scheduler, keep, torch)
                        _keep_scheduler_rows(action_scheduler, keep, torch)
                        # the cached text K/V has the old batch size; it is rebuilt on the next forward
                        self.transformer.reset_cache()
                self.transformer.set_denoising_step(step_index=i, num_steps=len(timesteps))
                latents, action_latents = state["latents"], state["action_latents"]
                timestep = t.unsqueeze(0).expand(latents.shape[0]) if t.dim() == 0 else t
                scale = guidance if stage._cfg_active_at(timestep_values[i], guidance_interval) else 1.0
                common = dict(
                    latents=latents, timestep=timestep, video_shape=video_shape, fps=fps,
                    noisy_frame_mask=state["velocity_mask"], current_timestep=i,
                    action_latents=action_latents, action_domain_ids=state["action_domain_ids"],
                    action_noisy_mask=state["action_velocity_mask"], action_fps=action_fps,
                    action_start_frame_offset=offset,
                )
                if guidance > 1.0 and scale != 1.0:
                    text = dict(
                        cond_text_ids=state["cond_text_ids"], cond_text_mask=state["cond_text_mask"],
                        uncond_text_ids=state["uncond_text_ids"], uncond_text_mask=state["uncond_text_mask"],
                        guidance_scale=scale,
                    )
                    if cond_len == uncond_len:
                        # the reference forward is B=2 [uncond, cond] on a non-contiguous slice too
                        self._contiguous_proj_out = False
                        pred = stage._predict_noise_cfg_batched(max_text_seq_len=cond_len, **text, **common)
                    else:
                        self._contiguous_proj_out = True
                        pred = stage._predict_noise_text_cfg_serial(
                            cond_text_seq_len=cond_len, uncond_text_seq_len=uncond_len, **text, **common
                        )
                else:
                    self._contiguous_proj_out = True
                    pred = stage._run_transformer(
                        text_ids=state["cond_text_ids"], text_mask=state["cond_text_mask"], cache_key="cond",
                        max_text_seq_len=cond_len, **common,
                    )
                video_pred, action_pred = pred[0], pred[1]
                video_pred = video_pred * state["velocity_mask"]
                latents = video_scheduler.step(video_pred, t, latents, return_dict=False)[0]
                action_pred = action_pred * state["action_velocity_mask"]
                if raw_dim is not None and raw_dim < action_pred.shape[-1]:
                    action_pred[..., raw_dim:] = 0.0
                if rollout:
                    from candidate_scheduler.worker.rollout import sde_step

                    out = sde_step(action_latents, action_pred, sigmas[i], sigmas[i + 1], sigmas[min(1, len(sigmas) - 1)],
                                   float(sampling.noise_level), generators, raw_dim)
                    action_latents = out.pop("x_next")
                    if i in keep_steps:
                        records.append((i, out))
                else:
                    action_latents = action_scheduler.step(action_pred, t, action_latents, return_dict=False)[0]
                mask = state["action_velocity_mask"]
                action_latents = mask * action_latents + (1.0 - mask) * state["action_condition_latents"]
                vmask = state["velocity_mask"]
                latents = vmask * latents + (1.0 - vmask) * state["condition_latents"]
                state["latents"], state["action_latents"] = latents, action_latents
                report.steps_run += 1
        finally:
            self._contiguous_proj_out = False
            self.transformer.reset_denoising_step()
            self.transformer.reset_cache()
        report.denoise_s += time.perf_counter() - t1

        t2 = time.perf_counter()
        outputs = {}
        for local in cancelled:
            outputs[indices[local]] = GroupOutput(groups[local].item.request_id, "cancelled")
        if rows:
            actions = self._postprocess(state["action_latents"], raw_dim, first_req)
            for local, pg in enumerate(groups):
                if local in cancelled:
                    continue
                mine = [k for k, r in enumerate(rows) if r.group == local]
                n_obs = pg.images.shape[0]
                cand_ids = [c.candidate_id for c in pg.item.candidates]
                # rows are observation-major within a group; reply candidate-major [n, B, H, D]
                def per_candidate(arr: np.ndarray) -> np.ndarray:
                    # rows are observation-major within a group; replies are candidate-major [n, B, ...]
                    block = arr[mine].reshape(n_obs, len(cand_ids), *arr.shape[1:])
                    return np.ascontiguousarray(np.swapaxes(block, 0, 1))

                output = GroupOutput(pg.item.request_id, "ok", candidate_ids=cand_ids, actions=per_candidate(actions))
                if rollout:
                    final = state["action_latents"][..., :raw_dim].float().cpu().numpy()
                    output.rollout = {
                        name: per_candidate(np.stack([rec[name].cpu().numpy() for _i, rec in records], axis=1))
                        for name in ("log_probs", "latents", "next_latents", "means", "stds")
                    }
                    output.rollout["final_latents"] = per_candidate(final)
                    output.rollout_meta = {
                        "sigmas": sigmas.detach().to("cpu", torch.float32).numpy(),
                        "timesteps": timesteps.detach().to("cpu", torch.float32).numpy(),
                        "step_indices": np.asarray([i_ for i_, _rec in records], dtype=np.int64),
                    }
                outputs[indices[local]] = output
        report.postprocess_s += time.perf_counter() - t2
        return outputs

    def _use_initial_noise(self, req, noise: np.ndarray) -> None:
        """Caller-provided x_T for the action branch, prepared exactly like generated noise: padded to
        the model's action channels, padding zeroed, cast to the latent dtype, blended with the
        (policy: empty) condition."""
        torch = self._torch
        current = req.action_latents
        h, d = current.shape[1], current.shape[2]
        raw = int(req.extra["raw_action_dim"])
        given = torch.as_tensor(np.asarray(noise, dtype=np.float32))
        if given.ndim != 2 or given.shape[0] != h or not raw <= given.shape[1] <= d:
            raise ObservationError("bad_initial_noise", f"initial noise must be [{h}, {raw}..{d}], got {list(given.shape)}")
        padded = torch.zeros((1, h, d), dtype=torch.float32)
        padded[0, :, : given.shape[1]] = given
        padded = padded.to(device=current.device, dtype=current.dtype)
        padded[:, :, raw:] = 0.0
        mask = req.extra["action_velocity_mask"]
        req.action_latents = (1.0 - mask) * req.extra["action_condition_latents"] + mask * padded

    def _postprocess(self, action_latents, raw_dim, req) -> np.ndarray:
        from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3_action import (
            denormalize_action,
            load_action_stats,
        )

        pred = action_latents.float().cpu()
        if raw_dim is not None:
            pred = pred[:, :, :raw_dim]
        if self.stats_path is not None:
            method = getattr(req.sampling_params, "action_normalization", "quantile")
            pred = denormalize_action(pred, method, load_action_stats(self.stats_path))
        return pred.numpy().astype(np.float32, copy=False)

    def _peak_memory(self) -> int:
        torch = self._torch
        if self.device.startswith("cuda") and torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def reference_actions(self, image: np.ndarray, prompt: str, sampling: SamplingSpec, seed: int) -> np.ndarray:
        """sglang's own pipeline for one seed (the counting hooks stay installed; the proj_out layout hook
        is inert here, so the numerics are sglang's unchanged)."""
        with self._lock:
            return sglang_reference_actions(self.pipeline, self.server_args, image, prompt, sampling, seed)

    @contextmanager
    def counting(self):
        """Yields a dict that holds the forward/text/vae call counts made inside the block."""
        before = dict(self._counts)
        delta: dict = {}
        try:
            yield delta
        finally:
            delta.update({k: self._counts[k] - before[k] for k in before})


def _stats_dim(path: str | None) -> int | None:
    if not path:
        return None
    import json

    try:
        stats = json.loads(Path(path).read_text())
        return len(stats["global"]["q01"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # sglang's own loader reports a bad stats file when it is used


def _unique_rows(rows) -> tuple[list[int], list[int]]:
    """First-seen indices of distinct rows, and for every row the position of its distinct row."""
    seen: dict[bytes, int] = {}
    unique: list[int] = []
    inverse: list[int] = []
    data = rows.cpu().numpy()
    for i in range(data.shape[0]):
        key = data[i].tobytes()
        if key not in seen:
            seen[key] = len(unique)
            unique.append(i)
        inverse.append(seen[key])
    return unique, inverse


def _keep_rows(state: dict, keep: list[int], torch) -> dict:
    idx = torch.as_tensor(keep, device=state["latents"].device)
    return {name: state[name].index_select(0, idx) for name in ROW_TENSORS}


def _keep_record(record: dict, keep: list[int], torch) -> dict:
    idx = torch.as_tensor(keep)
    return {name: t.index_select(0, idx.to(t.device)) for name, t in record.items()}


def _keep_scheduler_rows(scheduler, keep: list[int], torch) -> None:
    for name in SCHEDULER_ROW_STATE:
        value = getattr(scheduler, name, None)
        if isinstance(value, list):
            setattr(
                scheduler,
                name,
                [v.index_select(0, torch.as_tensor(keep, device=v.device)) if v is not None else None for v in value],
            )
        elif value is not None:
            setattr(scheduler, name, value.index_select(0, torch.as_tensor(keep, device=value.device)))
