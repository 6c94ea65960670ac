"""One denoise step of a Cosmos3 running batch: cohorts, one forward each, CFG per group, each group's
own solvers (stepped together for groups in lockstep).

This mirrors `Cosmos3DenoisingStage._denoise_once` for the action-policy subset, for many groups at
once, and calls the stage's own `_run_transformer` so the model math stays sglang's:

- Groups are partitioned into cohorts that can share a forward (`Cosmos3Group.forward_key`): equal
  shapes and rates, equal CFG mode at this step, equal text length(s). Each cohort runs ONE transformer
  forward over all its rows (two for serial CFG, as sglang does) with a per-row timestep: each row
  carries its own group's current t, whatever step that group is at. A forward runs as one call, or
  as one call per span of at most `model.call_rows` candidates (below).
- CFG is combined per group with that group's own effective guidance scale, with sglang's own
  arithmetic (`uncond + g * (cond - uncond)`, g a Python float, as in `_predict_noise_cfg_batched` and
  `_predict_noise_text_cfg_serial`); then each group's own video and action solvers step its own rows.
  A row's result is bitwise its result alone: the Cosmos3 forward is row independent on this path
  (notes §5b), and elementwise ops do not care which rows sit beside them. Groups in lockstep (same
  schedule, same step) step their solvers once over all their rows (cosmos3_solvers); between steps
  each group keeps its own solver state.
- Row independence holds on the CPU, not on CUDA: there batched candidates came out up to 0.56 away
  from sglang alone on an H200 while N=1 was bitwise (bench/results/gpu_check_20261204b); which op
  depends on the rows beside a candidate is not known yet. `model.call_rows` caps the candidate rows
  one transformer call carries: at 1 each candidate's call has the shape of sglang's own request
  (B=1, or B=2 [uncond; cond] under batched CFG), while the cohort still shares its conditioning, its
  solver steps and the worker's running batch (`call_spans`).
- `proj_out` gets the input layout sglang's own request would give it: contiguous where the reference
  forward runs at B=1 (no CFG, serial CFG), as it comes in the batched-CFG path (the reference forward
  itself is B=2 on a non-contiguous slice there).
- The transformer caches UND K/V per cache key. Every distinct cohort (its forward key and its members)
  gets cache keys of its own (one per call span), never reused for other rows; when the membership
  changes the new cohort rebuilds its K/V from the rows its groups made live when they joined
  (cosmos3_conditioning).
- `transformer.set_denoising_step` selects per-step precision with a step precision controller (FP8);
  then only groups at the same step share a forward (the forward key says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from candidate_scheduler.worker.cosmos3_rows import BATCHED_CFG, NO_CFG, SERIAL_CFG, Cosmos3Group
from candidate_scheduler.worker.cosmos3_solvers import step_together


@dataclass(eq=False)
class Cohort:
    """The groups that share forwards, their rows stacked once per membership (not per step).

    Forward inputs that do not change during the denoise (masks, domain ids, text rows, and the
    [uncond; cond] doubling of batched CFG) are stacked when the cohort forms. Latents and timesteps do
    change: a single group's own tensors go straight into the forward (no copy); several groups, or the
    doubled rows of batched CFG, are copied into buffers the cohort owns. The solvers never see these
    buffers (FlowUniPC keeps the sample it was given as `last_sample`), only each group's own tensors."""

    name: str  # prefix of this cohort's UND K/V cache keys in the transformer
    mode: str
    members: list
    bounds: list  # (first row, end row) of each member
    rows: int
    copies: int  # 2 for batched CFG ([uncond; cond] rows), else 1
    inputs: dict
    latents: torch.Tensor | None = None  # buffers: None when the single member's tensors are used
    action_latents: torch.Tensor | None = None
    timestep: torch.Tensor | None = None
    cache_keys: set = field(default_factory=set)  # its UND K/V keys in the transformer (one per call span)
    # a span's rows of the inputs that do not change during the denoise, cut once: (input, span) -> tensor
    span_inputs: dict = field(default_factory=dict)


def _stack(members, name: str, copies: int = 1) -> torch.Tensor:
    parts = [g.tensors[name] for g in members]
    if len(parts) == 1 and copies == 1:
        return parts[0]
    return torch.cat(parts * copies, dim=0)


def build_cohort(name: str, mode: str, members: list[Cosmos3Group]) -> Cohort:
    copies = 2 if mode == BATCHED_CFG else 1
    bounds, start = [], 0
    for g in members:
        bounds.append((start, start + g.rows))
        start += g.rows
    inputs = {n: _stack(members, n, copies) for n in ("velocity_mask", "action_velocity_mask", "action_domain_ids")}
    if mode == BATCHED_CFG:
        inputs["text_ids"] = torch.cat([_stack(members, "uncond_text_ids"), _stack(members, "cond_text_ids")])
        inputs["text_mask"] = torch.cat([_stack(members, "uncond_text_mask"), _stack(members, "cond_text_mask")])
    else:
        for branch in ("cond", "uncond") if mode == SERIAL_CFG else ("cond",):
            inputs[f"{branch}_text_ids"] = _stack(members, f"{branch}_text_ids")
            inputs[f"{branch}_text_mask"] = _stack(members, f"{branch}_text_mask")
    cohort = Cohort(name, mode, list(members), bounds, start, copies, inputs)
    if len(members) > 1 or copies > 1:
        lead = members[0]
        cohort.latents = lead.latents.new_empty((copies * start, *lead.latents.shape[1:]))
        cohort.action_latents = lead.action_latents.new_empty((copies * start, *lead.action_latents.shape[1:]))
        cohort.timestep = lead.timesteps.new_empty((copies * start,))
    return cohort


class Cohorts:
    """The cohorts of the last step, by signature (forward key, member uids); each has UND K/V cache
    keys of its own in the transformer, dropped when the cohort is."""

    def __init__(self, transformer):
        self.transformer = transformer
        self._cohorts: dict[tuple, Cohort] = {}
        self._counter = 0

    def get(self, key: tuple, members: list[Cosmos3Group]) -> tuple[tuple, Cohort]:
        signature = (key, tuple(g.uid for g in members))
        cohort = self._cohorts.get(signature)
        if cohort is None:
            self._counter += 1
            cohort = self._cohorts[signature] = build_cohort(f"cohort{self._counter}", key[0], members)
        return signature, cohort

    def keep_only(self, signatures) -> None:
        if len(signatures) == len(self._cohorts):
            return  # every cohort of the last step ran again (the common case)
        keep = set(signatures)
        for signature in [s for s in self._cohorts if s not in keep]:
            self._drop(signature)

    def drop_group(self, uid: int) -> None:
        for signature in [s for s in self._cohorts if uid in s[1]]:
            self._drop(signature)

    def _drop(self, signature: tuple) -> None:
        cohort = self._cohorts.pop(signature)
        for key in cohort.cache_keys:
            self.transformer.reset_cache(key)


def plan_cohorts(groups, step_sensitive: bool) -> dict[tuple, list[Cosmos3Group]]:
    cohorts: dict[tuple, list[Cosmos3Group]] = {}
    for g in groups:
        if g.done:
            raise ValueError(f"group {g.request_id!r} is done; finish it instead of stepping it")
        cohorts.setdefault(g.forward_key(step_sensitive), []).append(g)
    return cohorts


def run_step(model, groups) -> int:
    """Advance every group by one step; returns the transformer forwards run (a forward: one cohort's
    rows through the model once, in however many calls `call_rows` splits it into)."""
    transformer = model.transformer
    step_sensitive = transformer.step_precision_controller is not None
    forwards, used, stepped, preds = 0, [], [], []
    try:
        for key, members in plan_cohorts(groups, step_sensitive).items():
            signature, cohort = model.cohorts.get(key, members)
            used.append(signature)
            n, cohort_preds = _run_cohort(model, cohort, step_sensitive)
            forwards += n
            stepped += cohort.members
            preds += cohort_preds
        # after every cohort's forward: groups in lockstep share solver steps across cohorts too
        advance(stepped, preds, model.share_solvers)
    finally:
        model.proj_out_contiguous = False
        model.text.serving = False
        if step_sensitive:
            transformer.reset_denoising_step()
    model.cohorts.keep_only(used)
    return forwards


def _combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    return uncond + scale * (cond - uncond)


def _step_inputs(cohort: Cohort):
    """This step's latents, action latents and per-row timesteps of a cohort's forward."""
    if cohort.latents is None:
        g = cohort.members[0]
        t = g.timesteps[g.step_index]
        return g.latents, g.action_latents, t.unsqueeze(0).expand(g.rows)
    rows = cohort.rows
    for g, (a, b) in zip(cohort.members, cohort.bounds):
        t = g.timesteps[g.step_index]
        for off in range(0, cohort.copies * rows, rows):
            cohort.latents[off + a : off + b].copy_(g.latents)
            cohort.action_latents[off + a : off + b].copy_(g.action_latents)
            cohort.timestep[off + a : off + b].fill_(t)
    return cohort.latents, cohort.action_latents, cohort.timestep


def call_spans(rows: int, limit: int | None) -> list[tuple[int, int]]:
    """The (first, end) candidate rows of each transformer call over `rows` rows, at most `limit` a call
    (None: one call for them all)."""
    if not limit or limit >= rows:
        return [(0, rows)]
    return [(a, min(a + limit, rows)) for a in range(0, rows, limit)]


def _rows_of(x: torch.Tensor, copies: int, rows: int, a: int, b: int) -> torch.Tensor:
    """Rows a:b of a cohort input, of each copy ([uncond; cond] under batched CFG), in a fresh tensor: a
    call's inputs then look as sglang's own request's do, not like a view into a larger batch."""
    if copies == 1:
        return x[a:b].clone()
    return torch.cat([x[off + a : off + b] for off in range(0, copies * rows, rows)])


_ROW_INPUTS = ("velocity_mask", "action_velocity_mask", "action_domain_ids")  # what a call reads of `inputs`


def _span_input(cohort: Cohort, name: str, x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """`_rows_of` for an input that does not change during the denoise: cut once per cohort and span."""
    key = (name, a, b)
    if key not in cohort.span_inputs:
        cohort.span_inputs[key] = _rows_of(x, cohort.copies, cohort.rows, a, b)
    return cohort.span_inputs[key]


def _calls(cohort: Cohort, forward, spans, step_inputs, text_ids, text_mask, branch: str, text_len: int) -> tuple:
    """One forward over the cohort's rows, as one transformer call or one call per span; each output in
    the cohort's row layout either way."""
    latents, action_latents, timestep = step_inputs
    if len(spans) == 1:
        return forward(latents, action_latents, timestep, cohort.inputs, text_ids, text_mask, branch, text_len)
    copies, rows = cohort.copies, cohort.rows
    outs = []
    for a, b in spans:
        inputs = {name: _span_input(cohort, name, cohort.inputs[name], a, b) for name in _ROW_INPUTS}
        latents_ab, actions_ab, timestep_ab = (_rows_of(x, copies, rows, a, b) for x in step_inputs)
        # a cache key of its own per span: the transformer keeps UND K/V per key, for the key's rows
        outs.append(forward(latents_ab, actions_ab, timestep_ab, inputs,
                            _span_input(cohort, f"{branch}:ids", text_ids, a, b),
                            _span_input(cohort, f"{branch}:mask", text_mask, a, b),
                            f"{branch}:{a}-{b}", text_len))
    # back in the cohort's layout: [rows] per output, or [uncond rows; cond rows] under batched CFG
    joined = []
    for k in range(len(outs[0])):
        parts = [o[k][c * (b - a) : (c + 1) * (b - a)] for c in range(copies) for o, (a, b) in zip(outs, spans)]
        joined.append(torch.cat(parts))
    return tuple(joined)


def _run_cohort(model, cohort: Cohort, step_sensitive: bool) -> tuple[int, list]:
    """The cohort's forwards: (how many, each member's (video, action) prediction)."""
    stage = model.denoise_stage
    members, bounds = cohort.members, cohort.bounds
    lead = members[0]
    stage._share_vision_temporal_positions = lead.share_vision
    stage._extra_transformer_kwargs = {}
    if step_sensitive:
        model.transformer.set_denoising_step(step_index=lead.step_index, num_steps=lead.steps)
    spans = call_spans(cohort.rows, model.call_rows)
    step_inputs = _step_inputs(cohort)

    def forward(latents, action_latents, timestep, inputs, text_ids, text_mask, branch, text_len):
        cache_key = f"{cohort.name}:{branch}"
        cohort.cache_keys.add(cache_key)
        return stage._run_transformer(
            latents=latents, timestep=timestep, text_ids=text_ids, text_mask=text_mask,
            video_shape=lead.video_shape, fps=lead.fps, cache_key=cache_key,
            noisy_frame_mask=inputs["velocity_mask"], max_text_seq_len=text_len, current_timestep=lead.step_index,
            action_latents=action_latents, action_domain_ids=inputs["action_domain_ids"],
            action_noisy_mask=inputs["action_velocity_mask"], action_fps=lead.action_fps,
            action_start_frame_offset=lead.action_offset,
        )

    def call(branch: str, text_len: int, ids: str = "", mask: str = ""):
        ids, mask = ids or f"{branch}_text_ids", mask or f"{branch}_text_mask"
        return _calls(cohort, forward, spans, step_inputs, cohort.inputs[ids], cohort.inputs[mask], branch, text_len)

    mode = cohort.mode
    model.text.serve(2 if mode == BATCHED_CFG else 1)  # the rows of the calls its text rows were acquired in
    if mode == NO_CFG:
        model.proj_out_contiguous = True
        video, action = call("cond", lead.cond_len)
        if len(members) == 1:
            preds = [(video, action)]
        else:
            preds = [(video[a:b], action[a:b]) for a, b in bounds]
        branches = 1
    elif mode == SERIAL_CFG:
        model.proj_out_contiguous = True
        cond = call("cond", lead.cond_len)
        uncond = call("uncond", lead.uncond_len)
        preds = [
            tuple(_combine(c[a:b], u[a:b], g.cfg_plan[g.step_index][1]) for c, u in zip(cond, uncond, strict=True))
            for g, (a, b) in zip(members, bounds)
        ]
        branches = 2
    elif mode == BATCHED_CFG:
        # the reference forward is B=2 [uncond, cond] on a non-contiguous proj_out slice too
        model.proj_out_contiguous = False
        out = call("cfg", lead.cond_len, "text_ids", "text_mask")
        rows = cohort.rows
        preds = [
            tuple(_combine(o[rows + a : rows + b], o[a:b], g.cfg_plan[g.step_index][1]) for o in out)
            for g, (a, b) in zip(members, bounds)
        ]
        branches = 1
    else:  # pragma: no cover - forward_key only makes the three above
        raise ValueError(f"unknown CFG mode {mode!r}")
    model.text.serving = False
    for g in members:
        g.report.transformer_forwards += branches
    return branches, preds


def advance(groups: list[Cosmos3Group], preds: list, share: bool = True) -> None:
    """One solver step of each group's own rows, as sglang's denoise loop does it; with `share`, the
    solvers of groups in lockstep step once over all their rows (cosmos3_solvers)."""
    video_preds, action_preds = [], []
    for g, (video_pred, action_pred) in zip(groups, preds):
        video_preds.append(video_pred * g.tensors["velocity_mask"])
        action_pred = action_pred * g.tensors["action_velocity_mask"]
        if g.raw_dim is not None and g.raw_dim < action_pred.shape[-1]:
            action_pred[..., g.raw_dim:] = 0.0
        action_preds.append(action_pred)
    ts = [g.timesteps[g.step_index] for g in groups]
    solver = [k for k in range(len(groups)) if not groups[k].sampling.rollout]  # rollouts: SDE steps
    if share and len(groups) > 1:
        latents = step_together([g.video_scheduler for g in groups], [g.solver_key for g in groups], video_preds,
                                ts, [g.tensors["latents"] for g in groups])
        actions = dict(zip(solver, step_together(
            [groups[k].action_scheduler for k in solver], [groups[k].action_solver_key for k in solver],
            [action_preds[k] for k in solver], [ts[k] for k in solver],
            [groups[k].tensors["action_latents"] for k in solver])))
    else:
        latents = [g.video_scheduler.step(p, t, g.tensors["latents"], return_dict=False)[0]
                   for g, p, t in zip(groups, video_preds, ts)]
        actions = {k: groups[k].action_scheduler.step(action_preds[k], ts[k], groups[k].tensors["action_latents"],
                                                      return_dict=False)[0] for k in solver}
    for k, g in enumerate(groups):
        action_latents = actions[k] if k in actions else _rollout_step(g, action_preds[k])
        tensors = g.tensors
        # re-blend the clean condition: mask * x + (1 - mask) * condition, the second term computed once
        # per group (cosmos3_rows.BLEND_TERMS): the same values, so the same bits, as sglang's loop
        tensors["action_latents"] = tensors["action_velocity_mask"] * action_latents + tensors["action_condition_term"]
        tensors["latents"] = tensors["velocity_mask"] * latents[k] + tensors["condition_term"]
        g.step_index += 1
        g.report.steps_run += 1


def _rollout_step(g: Cosmos3Group, action_pred: torch.Tensor) -> torch.Tensor:
    """A rollout's action step: the SDE step with each candidate's own noise stream (never shared)."""
    from candidate_scheduler.worker.rollout import sde_step

    i, sigmas = g.step_index, g.sigmas
    out = sde_step(g.tensors["action_latents"], action_pred, sigmas[i], sigmas[i + 1], sigmas[min(1, len(sigmas) - 1)],
                   float(g.sampling.noise_level), g.generators, g.raw_dim)
    keep = g.sampling.return_step_indices
    action_latents = out.pop("x_next")
    if keep is None or i in keep:
        g.records.append((i, out))
    return action_latents
