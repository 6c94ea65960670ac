"""A stand-in for `sgl_kernel`, used by `make gpu-check` only where the real one is not installed.

sglang 0.5.23 imports `sgl_kernel` at module level on CUDA (`runtime/layers/layernorm.py`:
`rmsnorm`, `fused_add_rmsnorm`). Its wheel is hundreds of MB and cannot travel to a lent machine
with no registry (64 MiB per call), so this file gives the same functions in plain torch, with
sgl_kernel's semantics (fp32 statistics, the input's dtype out; `fused_add_rmsnorm` updates both
arguments in place). Any other name imports, and raises when called, naming itself: a figure
is never taken through a kernel this file does not implement. The report says when it was used.
"""

from __future__ import annotations

import torch

STAND_IN = True


def rmsnorm(input, weight, eps: float = 1e-6, out=None, enable_pdl=None):  # noqa: A002 - sgl_kernel's names
    x = input.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(input.dtype) * weight
    if out is None:
        return y
    out.copy_(y)
    return out


def fused_add_rmsnorm(input, residual, weight, eps: float = 1e-6, enable_pdl=None):  # noqa: A002
    residual.add_(input)
    input.copy_(rmsnorm(residual, weight, eps))


def silu_and_mul(input, out=None):  # noqa: A002
    d = input.shape[-1] // 2
    y = torch.nn.functional.silu(input[..., :d]) * input[..., d:]
    if out is None:
        return y
    out.copy_(y)
    return out


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_args, **_kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not in the gpu-check stand-in (scripts/gpu_shims)")

    missing.__name__ = name
    return missing
