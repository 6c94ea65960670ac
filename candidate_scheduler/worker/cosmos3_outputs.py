"""Finishing a Cosmos3 group: its actions (and rollout arrays) from its final action latents.

Decoding stops at the action tensor: slice to raw_action_dim and denormalise with the checkpoint's
action stats (sglang's own functions); the video VAE decode never runs for policy actions. Rows are
observation-major inside a group; replies are candidate-major [n_candidates, B, ...].
"""

from __future__ import annotations

import time

import numpy as np
import torch

from candidate_scheduler.core.work import GroupOutput
from candidate_scheduler.worker.cosmos3_rows import Cosmos3Group
from candidate_scheduler.worker.rollout import ROLLOUT_STEP_FIELDS


def finish_group(g: Cosmos3Group, stats_path: str | None) -> GroupOutput:
    """The output of a done group; charges its postprocess_s."""
    t0 = time.perf_counter()
    action_latents = g.tensors["action_latents"]
    actions = denormalized_actions(action_latents, g.raw_dim, stats_path, g.normalization)
    n_cand = len(g.candidate_ids)

    def per_candidate(arr: np.ndarray) -> np.ndarray:
        block = arr.reshape(g.n_obs, n_cand, *arr.shape[1:])
        return np.ascontiguousarray(np.swapaxes(block, 0, 1))

    output = GroupOutput(g.request_id, "ok", candidate_ids=list(g.candidate_ids), actions=per_candidate(actions))
    if g.sampling.rollout:
        output.rollout = {
            name: per_candidate(np.stack([rec[name].cpu().numpy() for _i, rec in g.records], axis=1))
            for name in ROLLOUT_STEP_FIELDS
        }
        output.rollout["final_latents"] = per_candidate(action_latents[..., : g.raw_dim].float().cpu().numpy())
        output.rollout_meta = {
            "sigmas": g.sigmas.detach().to("cpu", torch.float32).numpy(),
            "timesteps": g.timesteps.detach().to("cpu", torch.float32).numpy(),
            "step_indices": np.asarray([i for i, _rec in g.records], dtype=np.int64),
        }
    g.report.postprocess_s += time.perf_counter() - t0
    return output


def denormalized_actions(action_latents: torch.Tensor, raw_dim: int | None, stats_path: str | None,
                         method: str) -> np.ndarray:
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3_action import (
        denormalize_action,
        load_action_stats,
    )

    pred = action_latents.float().cpu()
    if raw_dim is not None:
        pred = pred[:, :, :raw_dim]
    if stats_path is not None:
        pred = denormalize_action(pred, method, load_action_stats(stats_path))
    return pred.numpy().astype(np.float32, copy=False)
