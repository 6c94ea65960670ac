"""A stand-in for `sgl_kernel`, used by `make gpu-check` only where the real one is not installed.

sglang 0.5.23 imports `sgl_kernel` at module level on CUDA (`runtime/layers/layernorm.py`:
`rmsnorm`, `fused_add_rmsnorm`). Its wheel is hundreds of MB and cannot travel to a lent machine
with no registry (64 MiB per call), so this file gives the same functions in plain torch, with
sgl_kernel's semantics (fp32 statistics, the input's dtype out; `fused_add_rmsnorm` updates both
arguments in place). Any other name imports, and raises when called, naming itself: a figure
is never taken through a kernel this file does not implement. The report says when it was used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

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


class _Missing:
    """A name sgl_kernel would have: its attributes are further missing names (sglang reads constants
    such as `scalar_types.uint4b8` at import time); calling any of them raises, naming it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *_args, **_kwargs):
        raise NotImplementedError(f"sgl_kernel.{self._name} is not in the gpu-check stand-in (scripts/gpu_shims)")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`from sgl_kernel.quantization import X` (sglang's srt layers import several submodules at
    import time): each submodule is a module whose every name raises when called."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Submodules())
