"""One denoise step of a Cosmos3 running batch: cohorts, one forward each, CFG per group, each group's
own solvers.

This mirrors `Cosmos3DenoisingStage._denoise_once` for the action-policy subset, for many groups at
once, and calls the stage's own `_run_transformer` so the model math stays sglang's:

- Groups are partitioned into cohorts that can share a forward (`Cosmos3Group.forward_key`): equal
  shapes and rates, equal CFG mode at this step, equal text length(s). Each cohort runs ONE transformer
  forward over all its rows (two for serial CFG, as sglang does) with a per-row timestep: each row
  carries its own group's current t, whatever step that group is at.
- CFG is combined per group with that group's own effective guidance scale, with sglang's own
  arithmetic (`uncond + g * (cond - uncond)`, g a Python float, as in `_predict_noise_cfg_batched` and
  `_predict_noise_text_cfg_serial`); then each group's own video and action solvers step its own rows.
  A row's result is bitwise its result alone: the Cosmos3 forward is row independent on this path
  (notes §5b), elementwise ops do not care which rows sit beside them, and no solver state is shared.
- `proj_out` gets the input layout sglang's own request would give it: contiguous where the reference
  forward runs at B=1 (no CFG, serial CFG), as it comes in the batched-CFG path (the reference forward
  itself is B=2 on a non-contiguous slice there).
- The transformer caches UND K/V per cache key. Every distinct cohort (its forward key and its members)
  gets cache keys of its own, never reused for other rows; when the membership changes the new cohort
  rebuilds its K/V from the rows its groups made live when they joined (cosmos3_conditioning).
- `transformer.set_denoising_step` selects per-step precision with a step precision controller (FP8);
  then only groups at the same step share a forward (the forward key says so).
"""

from __future__ import annotations

import torch

from candidate_scheduler.worker.cosmos3_rows import BATCHED_CFG, NO_CFG, SERIAL_CFG, Cosmos3Group


class CohortCaches:
    """Names of the transformer's UND K/V cache entries, one set per distinct cohort."""

    BRANCHES = ("cond", "uncond", "cfg")

    def __init__(self, transformer):
        self.transformer = transformer
        self._names: dict[tuple, str] = {}
        self._counter = 0

    def name(self, signature: tuple) -> str:
        name = self._names.get(signature)
        if name is None:
            self._counter += 1
            name = self._names[signature] = f"cohort{self._counter}"
        return name

    def keep_only(self, signatures) -> None:
        keep = set(signatures)
        for signature in [s for s in self._names if s not in keep]:
            self._drop(signature)

    def drop_group(self, uid: int) -> None:
        for signature in [s for s in self._names if uid in s[1]]:
            self._drop(signature)

    def _drop(self, signature: tuple) -> None:
        name = self._names.pop(signature)
        for branch in self.BRANCHES:
            self.transformer.reset_cache(f"{name}:{branch}")


def plan_cohorts(groups, step_sensitive: bool) -> dict[tuple, list[Cosmos3Group]]:
    cohorts: dict[tuple, list[Cosmos3Group]] = {}
    for g in groups:
        if g.done:
            raise ValueError(f"group {g.request_id!r} is done; finish it instead of stepping it")
        cohorts.setdefault(g.forward_key(step_sensitive), []).append(g)
    return cohorts


def run_step(model, groups) -> int:
    """Advance every group by one step; returns the transformer forwards run."""
    transformer = model.transformer
    step_sensitive = transformer.step_precision_controller is not None
    cohorts = plan_cohorts(groups, step_sensitive)
    forwards, used = 0, []
    try:
        for key, members in cohorts.items():
            signature = (key, tuple(g.uid for g in members))
            used.append(signature)
            forwards += _run_cohort(model, key, members, model.cohort_caches.name(signature), step_sensitive)
    finally:
        model.proj_out_contiguous = False
        model.text.serving = False
        if step_sensitive:
            transformer.reset_denoising_step()
    model.cohort_caches.keep_only(used)
    return forwards


def _cat(members, name: str) -> torch.Tensor:
    if len(members) == 1:
        return members[0].tensors[name]
    return torch.cat([g.tensors[name] for g in members], dim=0)


def _combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    return uncond + scale * (cond - uncond)


def _run_cohort(model, key: tuple, members: list[Cosmos3Group], name: str, step_sensitive: bool) -> int:
    stage = model.denoise_stage
    lead = members[0]
    mode = key[0]
    latents = _cat(members, "latents")
    action_latents = _cat(members, "action_latents")
    velocity_mask = _cat(members, "velocity_mask")
    action_mask = _cat(members, "action_velocity_mask")
    domain_ids = _cat(members, "action_domain_ids")
    timestep = torch.cat([g.timesteps[g.step_index].unsqueeze(0).expand(g.rows) for g in members])
    bounds, start = [], 0
    for g in members:
        bounds.append((start, start + g.rows))
        start += g.rows
    total = start

    stage._share_vision_temporal_positions = lead.share_vision
    stage._extra_transformer_kwargs = {}
    if step_sensitive:
        model.transformer.set_denoising_step(step_index=lead.step_index, num_steps=lead.steps)
    model.text.serving = True

    def forward(latents, timestep, text_ids, text_mask, branch, text_len, vmask, actions, domains, amask):
        return stage._run_transformer(
            latents=latents, timestep=timestep, text_ids=text_ids, text_mask=text_mask,
            video_shape=lead.video_shape, fps=lead.fps, cache_key=f"{name}:{branch}",
            noisy_frame_mask=vmask, max_text_seq_len=text_len, current_timestep=lead.step_index,
            action_latents=actions, action_domain_ids=domains, action_noisy_mask=amask,
            action_fps=lead.action_fps, action_start_frame_offset=lead.action_offset,
        )

    rows = (velocity_mask, action_latents, domain_ids, action_mask)
    if mode == NO_CFG:
        model.proj_out_contiguous = True
        out = forward(latents, timestep, _cat(members, "cond_text_ids"), _cat(members, "cond_text_mask"),
                      "cond", lead.cond_len, velocity_mask, action_latents, domain_ids, action_mask)
        preds = [(out[0][a:b], out[1][a:b]) for a, b in bounds]
        forwards = 1
    elif mode == SERIAL_CFG:
        model.proj_out_contiguous = True
        cond = forward(latents, timestep, _cat(members, "cond_text_ids"), _cat(members, "cond_text_mask"),
                       "cond", lead.cond_len, *rows)
        uncond = forward(latents, timestep, _cat(members, "uncond_text_ids"), _cat(members, "uncond_text_mask"),
                         "uncond", lead.uncond_len, *rows)
        preds = [
            tuple(_combine(c[a:b], u[a:b], g.cfg_plan[g.step_index][1]) for c, u in zip(cond, uncond, strict=True))
            for g, (a, b) in zip(members, bounds)
        ]
        forwards = 2
    elif mode == BATCHED_CFG:
        # the reference forward is B=2 [uncond, cond] on a non-contiguous proj_out slice too
        model.proj_out_contiguous = False
        text_ids = torch.cat([_cat(members, "uncond_text_ids"), _cat(members, "cond_text_ids")])
        text_mask = torch.cat([_cat(members, "uncond_text_mask"), _cat(members, "cond_text_mask")])
        out = forward(
            torch.cat([latents, latents]), torch.cat([timestep, timestep]), text_ids, text_mask, "cfg",
            lead.cond_len, torch.cat([velocity_mask, velocity_mask]), torch.cat([action_latents, action_latents]),
            torch.cat([domain_ids, domain_ids]), torch.cat([action_mask, action_mask]),
        )
        preds = [
            tuple(_combine(o[total + a : total + b], o[a:b], g.cfg_plan[g.step_index][1]) for o in out)
            for g, (a, b) in zip(members, bounds)
        ]
        forwards = 1
    else:  # pragma: no cover - forward_key only makes the three above
        raise ValueError(f"unknown CFG mode {mode!r}")
    model.text.serving = False
    for g, (video_pred, action_pred) in zip(members, preds):
        advance(g, video_pred, action_pred)
        g.report.transformer_forwards += forwards
    return forwards


def advance(g: Cosmos3Group, video_pred: torch.Tensor, action_pred: torch.Tensor) -> None:
    """One solver step of a group's own rows, as sglang's denoise loop does it."""
    i = g.step_index
    t = g.timesteps[i]
    tensors = g.tensors
    video_pred = video_pred * tensors["velocity_mask"]
    latents = g.video_scheduler.step(video_pred, t, tensors["latents"], return_dict=False)[0]
    action_pred = action_pred * tensors["action_velocity_mask"]
    raw_dim = g.raw_dim
    if raw_dim is not None and raw_dim < action_pred.shape[-1]:
        action_pred[..., raw_dim:] = 0.0
    action_latents = tensors["action_latents"]
    if g.sampling.rollout:
        from candidate_scheduler.worker.rollout import sde_step

        sigmas = g.sigmas
        out = sde_step(action_latents, action_pred, sigmas[i], sigmas[i + 1], sigmas[min(1, len(sigmas) - 1)],
                       float(g.sampling.noise_level), g.generators, raw_dim)
        action_latents = out.pop("x_next")
        keep = g.sampling.return_step_indices
        if keep is None or i in keep:
            g.records.append((i, out))
    else:
        action_latents = g.action_scheduler.step(action_pred, t, action_latents, return_dict=False)[0]
    mask = tensors["action_velocity_mask"]
    tensors["action_latents"] = mask * action_latents + (1.0 - mask) * tensors["action_condition_latents"]
    vmask = tensors["velocity_mask"]
    tensors["latents"] = vmask * latents + (1.0 - vmask) * tensors["condition_latents"]
    g.step_index += 1
    g.report.steps_run += 1
