"""Flow-SDE rollout of the Cosmos3 action branch, one generator per candidate.

The transition is sglang's FlowGRPO-style `sde` step (post_training/flow_rollout_controller.py,
`flow_sde_sampling`), computed in float32. With sigma the current sigma and dt = sigma_next - sigma:

    std_t     = noise_level * sqrt(sigma / (1 - sigma'))       sigma' = sigmas[1] where sigma == 1
    noise_std = std_t * sqrt(-dt)
    mean      = x * (1 + std_t^2 / (2 sigma) * dt) + v * (1 + std_t^2 (1 - sigma) / (2 sigma)) * dt
    x_next    = mean + noise_std * eps
    log_prob  = sum over the active action dims of log N(x_next; mean, noise_std^2)

What differs from sglang (the seed-002 bugs): eps for candidate i is drawn from candidate i's own
generator with candidate i's own shape [1, H, raw_dim] (sglang draws the FULL batch shape from every
generator, so batched and sequential runs diverge), and the padded action channels stay exactly zero
and out of the log-prob.
"""

from __future__ import annotations

import math

import torch

from candidate_scheduler.core.work import ROLLOUT_FIELDS

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)

# The per-step ones of the per-candidate rollout arrays (core/work.ROLLOUT_FIELDS, the one list; the
# last, final_latents, is the end state). Anything that slices a running batch must carry all of them.
ROLLOUT_STEP_FIELDS = tuple(name for name in ROLLOUT_FIELDS if name != "final_latents")


def sde_std(sigma: torch.Tensor, sigma_next: torch.Tensor, sigma_max: torch.Tensor, noise_level: float):
    """(std_t, noise_std) of one transition; sigma == 1 uses sigma_max (= sigmas[1]) in the
    denominator so the first step of a schedule starting at 1 stays finite."""
    denom = 1 - torch.where(torch.isclose(sigma, sigma.new_tensor(1.0)), sigma_max, sigma)
    std_t = torch.sqrt(sigma / denom) * noise_level
    return std_t, std_t * torch.sqrt(sigma - sigma_next)


def sde_mean(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor, std_t: torch.Tensor):
    dt = sigma_next - sigma
    return x * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt


def gaussian_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Sum over every non-batch dim of log N(x_next; mean, std^2), float32 [B]."""
    z = (x_next - mean) / std
    per_elem = -0.5 * z**2 - torch.log(std) - LOG_SQRT_2PI
    return per_elem.flatten(1).sum(dim=1)


def draw_noise(generators: list[torch.Generator], shape: tuple[int, ...], device) -> torch.Tensor:
    """One eps row per candidate, each from its own generator with its own shape [1, *shape]."""
    return torch.cat([torch.randn((1, *shape), generator=g, device=device, dtype=torch.float32) for g in generators])


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    sigma_max: torch.Tensor,
    noise_level: float,
    generators: list[torch.Generator],
    raw_dim: int | None,
) -> dict[str, torch.Tensor]:
    """One flow-SDE transition of the action latents [B, H, D_padded]; only [..., :raw_dim] moves.

    Returns x_next (padded, in x's dtype) and float32 per-row data on the active dims:
    latents (x), next_latents, means, stds [B], log_probs [B]. raw_dim None: every channel is active."""
    if len(generators) != x.shape[0]:
        # one generator for B rows would broadcast one eps row over them all: candidates sharing noise
        raise ValueError(f"sde_step needs one generator per row: {len(generators)} generator(s) for {x.shape[0]} rows")
    if raw_dim is not None and not 0 < raw_dim <= x.shape[-1]:
        # a negative width slices from the end, moving padded channels and counting them in the log-prob
        raise ValueError(f"raw_dim must be in [1, {x.shape[-1]}] (the padded action channels), got {raw_dim!r}")
    active_x = x[..., :raw_dim].float()
    active_v = v[..., :raw_dim].float()
    sigma, sigma_next, sigma_max = (t.float() for t in (sigma, sigma_next, sigma_max))
    std_t, noise_std = sde_std(sigma, sigma_next, sigma_max, noise_level)
    mean = sde_mean(active_x, active_v, sigma, sigma_next, std_t)
    eps = draw_noise(generators, tuple(active_x.shape[1:]), x.device)
    x_next_active = mean + noise_std * eps
    log_probs = gaussian_log_prob(x_next_active, mean, noise_std.expand_as(mean))
    x_next = torch.zeros_like(x)
    x_next[..., :raw_dim] = x_next_active.to(x.dtype)
    return {
        "x_next": x_next,
        "latents": active_x,
        "next_latents": x_next_active,
        "means": mean,
        "stds": noise_std.expand(x.shape[0]).clone(),
        "log_probs": log_probs,
    }
