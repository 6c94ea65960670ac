"""Solver steps of groups in lockstep, run once over all their rows.

Each group owns its UniPC solvers (FlowUniPC keeps model-output history and the last sample on the
instance). Groups that started together with the same schedule -- the groups of one dispatch batch, the
slices of one microbatched group, groups that joined a running batch at the same step boundary -- are in
lockstep: same timesteps, same step index, same solver order and history structure. Their solver steps
differ only in the tensors, so this module runs ONE `step` over their rows stacked, and hands each group
its rows of the result and of the new history back. A group keeps owning its own solver state between
steps, so a group may leave (done, cancelled, expired) or the set may change at any boundary with
nothing to split.

Why this is bitwise: FlowUniPC's step is elementwise per row with scalar coefficients taken from the
schedule (its einsums contract only the history axis, per row). A group of N candidates already runs
one solver over N rows and equals N sglang runs alone (the parity tests); stacked groups are the same
computation with more rows. The per-group parts of sglang's loop (velocity masks, the raw action
dimensions, the re-blend) stay per group.

Stacking costs a `cat` per history tensor; it pays for itself from two groups on (one solver step is
about 30 small tensor ops; see bench/README.md, step profile).
"""

from __future__ import annotations

import torch


def solver_signature(scheduler, timesteps: torch.Tensor) -> tuple:
    """What two solvers must share to step together, fixed when a group starts: the schedule and the
    solver configuration (the per-step state is compared at every step, `_state`)."""
    return (type(scheduler).__name__, tuple(timesteps.tolist()), tuple(scheduler.sigmas.tolist()),
            repr(sorted(scheduler.config.items())))


def _state(scheduler) -> tuple:
    return (scheduler.step_index, scheduler.lower_order_nums, getattr(scheduler, "this_order", None),
            scheduler.last_sample is None, tuple(m is None for m in scheduler.model_outputs))


def step_together(schedulers: list, signatures: list, preds: list[torch.Tensor], timesteps: list,
                  samples: list[torch.Tensor]) -> list[torch.Tensor]:
    """`schedulers[i].step(preds[i], timesteps[i], samples[i])[0]` for every i, with the solvers in
    lockstep (equal signature and state) and rows of one shape and dtype stepped once over their
    stacked rows. Groups in lockstep may run other shapes (another resolution or horizon, in other
    cohorts): their rows cannot be stacked, so they step apart."""
    sets: dict[tuple, list[int]] = {}
    for i, s in enumerate(schedulers):
        rows = (tuple(samples[i].shape[1:]), samples[i].dtype, tuple(preds[i].shape[1:]), preds[i].dtype)
        sets.setdefault((signatures[i], _state(s), rows), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(schedulers)
    for members in sets.values():
        if len(members) == 1:
            i = members[0]
            out[i] = schedulers[i].step(preds[i], timesteps[i], samples[i], return_dict=False)[0]
            continue
        for i, result in zip(members, _stacked_step([schedulers[i] for i in members], [preds[i] for i in members],
                                                    timesteps[members[0]], [samples[i] for i in members])):
            out[i] = result
    return out


def _stacked_step(schedulers: list, preds: list[torch.Tensor], timestep, samples: list[torch.Tensor]) -> list:
    lead = schedulers[0]
    bounds, start = [], 0
    for p in preds:
        bounds.append((start, start + p.shape[0]))
        start += p.shape[0]
    # the lead carries everyone's history through the step; every member gets its rows back after it
    lead.model_outputs = [None if m is None else torch.cat([s.model_outputs[j] for s in schedulers])
                          for j, m in enumerate(lead.model_outputs)]
    if lead.last_sample is not None:
        lead.last_sample = torch.cat([s.last_sample for s in schedulers])
    prev = lead.step(torch.cat(preds), timestep, torch.cat(samples), return_dict=False)[0]
    history, last = lead.model_outputs, lead.last_sample
    for s, (a, b) in zip(schedulers, bounds):
        s.model_outputs = [None if m is None else m[a:b] for m in history]
        s.last_sample = None if last is None else last[a:b]
        if s is not lead:
            s.timestep_list = list(lead.timestep_list)
            s.this_order, s.lower_order_nums, s._step_index = lead.this_order, lead.lower_order_nums, lead._step_index
    return [prev[a:b] for a, b in bounds]
