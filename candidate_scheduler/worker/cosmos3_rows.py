"""Starting one group of a Cosmos3 running batch: its rows, its starting noise, its own solvers.

A group's rows are (observation, candidate) pairs, observation-major. What `start_group` does, all of
it charged to the group's `condition_s`:

- sglang's own image preprocessing and tokenization, once per observation;
- each candidate's starting noise from sglang's own `Cosmos3LatentPreparationStage` at batch 1 with
  that candidate's generator (seed or snapshot), so it matches sglang's B=1 path draw for draw; the
  observation's VAE latent is encoded once for all its candidates (cosmos3_conditioning.VaeEncoder);
- the group's OWN timesteps from sglang's own `Cosmos3TimestepPreparationStage`, and its own deep
  copies of the UniPC scheduler for video and for action latents (FlowUniPC keeps model outputs and
  the last sample on the instance, so no two groups may share one; groups in lockstep step theirs
  together, cosmos3_solvers). That stage sets the shared stage
  scheduler's shift and timesteps; the copies are taken right after, which is the state sglang's own
  denoise loop starts from;
- the text pathway K/V of the group's distinct text rows, made live for the forwards it joins
  (cosmos3_conditioning.TextPathway), in the calls sglang's own request would make: the cond rows,
  the uncond rows, or [uncond; cond] in one call for batched CFG;
- its CFG plan: per step, no CFG, batched [uncond; cond] or serial, and the effective guidance scale
  (sglang's `_cfg_active_at` with the request's guidance interval).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from candidate_scheduler.core.request import MAX_OBSERVATIONS_PER_GROUP
from candidate_scheduler.core.work import BatchReport, CandidateWork, GroupWork, SamplingSpec
from candidate_scheduler.worker import generators
from candidate_scheduler.worker.cosmos3_conditioning import observation_key
from candidate_scheduler.worker.cosmos3_sglang import build_sglang_request
from candidate_scheduler.worker.cosmos3_solvers import solver_signature
from candidate_scheduler.worker.stepping import BadRequest

# What sglang's latent stage prepares per candidate (observation-major rows): the two noised latents
# it draws from the candidate's generator, and the masks, conditions and domain ids it keeps in
# `req.extra`. The text tensors are per observation and repeated over its candidates afterwards.
DRAWN_LATENTS = ("latents", "action_latents")
EXTRA_ROW_TENSORS = (
    "velocity_mask",
    "condition_latents",
    "action_velocity_mask",
    "action_condition_latents",
    "action_domain_ids",
)

# Step-invariant halves of the re-blend after each solver step, (1 - mask) * condition, per group:
# term name -> (mask, condition). Computed once at start instead of at every step.
BLEND_TERMS = {
    "condition_term": ("velocity_mask", "condition_latents"),
    "action_condition_term": ("action_velocity_mask", "action_condition_latents"),
}

NO_CFG, BATCHED_CFG, SERIAL_CFG = "none", "batched", "serial"


class ObservationError(BadRequest):
    """A group's observation batch (or its initial noise) cannot run; `code` is a short stable code."""


@dataclass(eq=False)
class Cosmos3Group:
    """One group (or slice of a group) in a running batch: a `stepping.RunningGroup`."""

    uid: int  # unique per adapter: two slices of one request are two groups
    request_id: str
    sampling: SamplingSpec
    candidate_ids: list[int]
    n_obs: int
    rows: int
    steps: int
    report: BatchReport
    tensors: dict  # per-row tensors (the latent stage's and the text's) and BLEND_TERMS -> [rows, ...]; the DRAWN_LATENTS move every step
    generators: list  # per row, past the initial-noise draws (rollout SDE noise continues them)
    timesteps: torch.Tensor
    sigmas: torch.Tensor  # the action scheduler's own sigmas [T+1] (rollouts)
    video_scheduler: object
    action_scheduler: object
    cfg_plan: list  # per step: (NO_CFG | BATCHED_CFG | SERIAL_CFG, effective guidance scale)
    cond_len: int
    uncond_len: int
    shape_key: tuple  # everything but text lengths and CFG mode that two forwards' rows must share
    video_shape: tuple
    fps: float
    action_fps: float | None
    action_offset: int
    raw_dim: int | None
    share_vision: bool
    normalization: str
    solver_key: tuple = ()  # cosmos3_solvers.solver_signature of the video solver (and the action one)
    action_solver_key: tuple = ()
    text_keys: list = field(default_factory=list)
    records: list = field(default_factory=list)  # rollouts: (step index, per-row tensors)
    step_index: int = 0

    @property
    def done(self) -> bool:
        return self.step_index >= self.steps

    @property
    def latents(self) -> torch.Tensor:
        return self.tensors["latents"]

    @property
    def action_latents(self) -> torch.Tensor:
        return self.tensors["action_latents"]

    def forward_key(self, step_sensitive: bool) -> tuple:
        """Groups with equal keys at this step may share one transformer forward: same shapes and
        rates, same CFG mode, same text length(s) for that mode (Cosmos3 does not mask padded text
        K/V), and with a step precision controller (FP8) the same step."""
        mode = self.cfg_plan[self.step_index][0]
        if mode == NO_CFG:
            lens = (self.cond_len,)
        elif mode == BATCHED_CFG:
            lens = (self.cond_len,)
        else:
            lens = (self.cond_len, self.uncond_len)
        step = (self.step_index, self.steps) if step_sensitive else None
        return (mode, lens, self.shape_key, step)


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


def start_group(model, item: GroupWork, uid: int) -> Cosmos3Group:
    """Everything a group needs before its first step (see the module docstring). `model` is the
    Cosmos3CandidateAdapter (its sglang stages, transformer and conditioning hooks)."""
    t0 = time.perf_counter()
    report = BatchReport()
    if not item.candidates:
        raise ObservationError("no_candidates", "a group slice must carry at least one candidate")
    images, prompts = validate_observations(item.images, item.prompts)
    sampling = item.sampling
    if sampling.raw_action_dim > model.action_dim:
        raise ObservationError(
            "bad_raw_action_dim", f"raw_action_dim must be in [1, {model.action_dim}], got {sampling.raw_action_dim}"
        )
    if model.stats_dim is not None and sampling.raw_action_dim != model.stats_dim:
        # the checkpoint's action statistics denormalise exactly this many dims
        raise ObservationError(
            "bad_raw_action_dim",
            f"this checkpoint's action stats cover {model.stats_dim} action dims; raw_action_dim is {sampling.raw_action_dim}",
        )
    sa = model.server_args
    observations = []
    try:
        for b in range(images.shape[0]):
            req = build_sglang_request(sa, images[b], prompts[b], sampling, 0, item.request_id)
            req = model.preprocess_stage.forward(req, sa)
            observations.append(model.tokenize_stage.forward(req, sa))
    except (ValueError, TypeError) as exc:  # sglang refusing the request's own fields
        raise BadRequest("bad_request", str(exc)) from exc
    lens = {(r.extra["cond_text_seq_len"], r.extra["uncond_text_seq_len"]) for r in observations}
    if len(lens) != 1:
        raise ObservationError(
            "prompt_length_mismatch",
            "prompts of one group must tokenize to the same length (Cosmos3 does not mask padded text K/V); "
            f"got lengths {sorted(pair[0] for pair in lens)}",
        )
    cond_len, uncond_len = lens.pop()

    per_row: dict[str, list] = {name: [] for name in DRAWN_LATENTS + EXTRA_ROW_TENSORS}
    generators, first = [], None
    for b, obs in enumerate(observations):
        with model.vae.observation(observation_key(images[b], sampling.height, sampling.width), report):
            for cand in item.candidates:
                req = copy.copy(obs)
                req.extra = dict(obs.extra)
                req.generator = _generator(cand, model.device)
                req = model.latent_stage.forward(req, sa)
                if cand.initial_noise is not None:
                    _use_initial_noise(req, cand.initial_noise)
                generators.append(req.generator)
                first = first or req
                per_row["latents"].append(req.latents)
                per_row["action_latents"].append(req.action_latents)
                for name in EXTRA_ROW_TENSORS:
                    per_row[name].append(req.extra[name])
    tensors = {name: torch.cat(values, dim=0) for name, values in per_row.items()}
    for term, (mask, condition) in BLEND_TERMS.items():
        tensors[term] = (1.0 - tensors[mask]) * tensors[condition]
    n_cand = len(item.candidates)
    text = {
        "cond_text_ids": _obs_text(observations, "cond_text_ids", cond_len),
        "cond_text_mask": _obs_text(observations, "cond_text_mask", cond_len),
        "uncond_text_ids": _obs_text(observations, "uncond_text_ids", uncond_len),
        "uncond_text_mask": _obs_text(observations, "uncond_text_mask", uncond_len),
    }
    for name, obs_rows in text.items():
        tensors[name] = obs_rows.repeat_interleave(n_cand, dim=0)

    # The group's own timesteps and solvers (see the module docstring).
    first = model.timestep_stage.forward(first, sa)
    shared = model.timestep_stage.scheduler
    timesteps = first.timesteps.clone()
    video_scheduler = copy.deepcopy(shared)
    action_scheduler = copy.deepcopy(shared)
    action_scheduler.set_timesteps(len(timesteps), device=timesteps.device)

    extra = first.extra
    params = first.sampling_params
    guidance = float(first.guidance_scale)
    interval = getattr(params, "guidance_interval", None)
    plan = []
    for value in timesteps.tolist():
        scale = guidance if model.denoise_stage._cfg_active_at(value, interval) else 1.0
        if guidance > 1.0 and scale != 1.0:
            plan.append((BATCHED_CFG if cond_len == uncond_len else SERIAL_CFG, scale))
        else:
            plan.append((NO_CFG, 1.0))
    latents = tensors["latents"]
    group = Cosmos3Group(
        uid=uid,
        request_id=item.request_id,
        sampling=sampling,
        candidate_ids=[c.candidate_id for c in item.candidates],
        n_obs=images.shape[0],
        rows=latents.shape[0],
        steps=len(timesteps),
        report=report,
        tensors=tensors,
        generators=generators,
        timesteps=timesteps,
        sigmas=action_scheduler.sigmas,
        video_scheduler=video_scheduler,
        action_scheduler=action_scheduler,
        cfg_plan=plan,
        cond_len=cond_len,
        uncond_len=uncond_len,
        shape_key=(),
        video_shape=tuple(extra["video_shape"]),
        fps=extra.get("fps", 24.0),
        action_fps=getattr(params, "action_fps", None),
        action_offset=extra.get("action_start_frame_offset", 1),
        raw_dim=extra["raw_action_dim"],
        share_vision=bool(getattr(params, "share_vision_temporal_positions", True)),
        normalization=getattr(params, "action_normalization", "quantile"),
    )
    group.solver_key = solver_signature(video_scheduler, timesteps)
    group.action_solver_key = solver_signature(action_scheduler, timesteps)
    group.shape_key = (
        tuple(latents.shape[1:]), str(latents.dtype), tuple(tensors["action_latents"].shape[1:]),
        group.video_shape, group.fps, group.action_fps, group.action_offset, group.share_vision,
    )
    try:
        _acquire_text(model, group, text)
    except BaseException:
        model.text.release(group.text_keys)
        raise
    report.rows = group.rows
    report.condition_s = time.perf_counter() - t0
    return group


def _obs_text(observations, name: str, length: int) -> torch.Tensor:
    """One text row per observation, cut to its real length (what the transformer cuts it to: the
    tokenizer pads cond and uncond to the longer of the two)."""
    return torch.cat([r.extra[name][:, :length] for r in observations], dim=0)


def _acquire_text(model, group: Cosmos3Group, text: dict) -> None:
    """Make the K/V of the group's distinct text rows live, in the calls sglang's request would make."""
    transformer = model.transformer
    _, _, t, h, w = group.latents.shape
    hp, wp, _, _ = transformer._pad_to_patch_size(h, w)

    def positions(mask):
        return transformer._compute_rope_position_ids(
            mask, t, hp, wp, group.fps, mask.device,
            sound_frames=0,
            action_frames=group.action_latents.shape[1],
            action_fps=group.action_fps if group.action_fps is not None else group.fps,
            action_start_frame_offset=group.action_offset,
            control_frames=[],
            share_vision_temporal_positions=group.share_vision,
            temporal_position_period=None,
        )[0]

    # where a row's bits may depend on its call (`by_request_rows`), one observation's calls, as sglang
    # runs each observation alone; elsewhere every observation's rows in one call
    rows = text["cond_text_ids"].shape[0]
    parts = [slice(b, b + 1) for b in range(rows)] if model.text.by_request_rows else [slice(0, rows)]
    calls = []
    for part in parts:
        cond = (text["cond_text_ids"][part], text["cond_text_mask"][part])
        uncond = (text["uncond_text_ids"][part], text["uncond_text_mask"][part])
        for mode in dict.fromkeys(m for m, _scale in group.cfg_plan):
            if mode == NO_CFG:
                calls.append(cond)
            elif mode == SERIAL_CFG:
                calls += [cond, uncond]
            else:
                calls.append((torch.cat([uncond[0], cond[0]]), torch.cat([uncond[1], cond[1]])))
    for ids, mask in calls:
        group.text_keys += model.text.acquire(ids, mask, positions(mask), group.report)


def _generator(cand: CandidateWork, device: str):
    if cand.snapshot is not None:
        return generators.restore(cand.snapshot, device)
    return torch.Generator(device=device).manual_seed(int(cand.seed))


def _use_initial_noise(req, noise: np.ndarray) -> None:
    """Caller-provided x_T for the action branch, prepared exactly like generated noise: padded to the
    model's action channels, padding zeroed, cast to the latent dtype, blended with the (policy:
    empty) condition."""
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
