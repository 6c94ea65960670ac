"""sde_step's contract on its inputs: one generator per row (else rows would share SDE noise, the
seed-002 symptom) and an active width inside the padded action channels."""

from __future__ import annotations

import pytest
import torch

from candidate_scheduler.worker.rollout import sde_step

H, D, RAW = 4, 16, 7


def _step(rows: int, generators: int, raw_dim: int | None = RAW):
    x = torch.randn(rows, H, D, generator=torch.Generator().manual_seed(0))
    x[..., RAW:] = 0
    v = torch.randn(rows, H, D, generator=torch.Generator().manual_seed(1))
    gens = [torch.Generator().manual_seed(100 + k) for k in range(generators)]
    sig = torch.tensor
    return sde_step(x, v, sig(0.9), sig(0.8), sig(0.95), 0.7, gens, raw_dim)


def test_each_row_draws_from_its_own_generator():
    out = _step(3, 3)
    noise = out["next_latents"] - out["means"]
    assert len({noise[k].numpy().tobytes() for k in range(3)}) == 3
    assert torch.all(out["x_next"][..., RAW:] == 0) and out["log_probs"].shape == (3,)


@pytest.mark.parametrize("generators", [1, 2, 4])
def test_a_generator_count_other_than_the_row_count_is_refused(generators):
    # one generator for three rows used to broadcast a single eps row over all of them silently
    with pytest.raises(ValueError, match="generator"):
        _step(3, generators)


@pytest.mark.parametrize("raw_dim", [0, -1, D + 1])
def test_an_active_width_outside_the_action_channels_is_refused(raw_dim):
    # -1 used to slice [..., :-1]: every padded channel but one moved and entered the log-prob
    with pytest.raises(ValueError, match="raw_dim"):
        _step(2, 2, raw_dim)
