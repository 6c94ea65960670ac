"""Random weights for a module too large to hold, streamed to safetensors shards.

The module is built on the `meta` device, so only names and shapes exist; each tensor is then
drawn from its own generator, seeded by the preset seed and the tensor's name, so a tensor's
values do not depend on thread scheduling or on which shard it lands in. At most two shards are
in memory at once (one being filled, one being written).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
INIT_STD = 0.02  # the tiny preset's scale: keeps 36 random pre-norm layers finite in bf16


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def build_on_meta(module_cls, config: dict):
    """Instantiate a diffusers model without allocating its weights."""
    import torch

    with torch.device("meta"):
        return module_cls(**config)


def tensor_specs(module, skip: tuple[str, ...] = ()) -> list[TensorSpec]:
    """Every tensor the module's state dict holds, sorted by name, minus `skip`."""
    return [TensorSpec(name, tuple(t.shape)) for name, t in sorted(module.state_dict().items()) if name not in skip]


def count_params(specs: list[TensorSpec]) -> int:
    return sum(s.numel for s in specs)


def plan_shards(specs: list[TensorSpec], bytes_per_value: int, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive runs of tensors up to max_shard_bytes each; a larger tensor gets a shard alone."""
    shards: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        nbytes = spec.numel * bytes_per_value
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [WEIGHTS_NAME]
    stem = WEIGHTS_NAME.removesuffix(".safetensors")
    return [f"{stem}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def is_norm_weight(name: str, ndim: int) -> bool:
    # The tiny preset's rule (tiny_checkpoint._init_weights): RMSNorm scales start at one.
    return ndim <= 1 and ("norm" in name or name.endswith("gamma"))


def random_tensor(spec: TensorSpec, seed: int, dtype):
    import torch

    if is_norm_weight(spec.name, len(spec.shape)):
        return torch.ones(spec.shape, dtype=dtype)
    gen = torch.Generator().manual_seed(tensor_seed(seed, spec.name))
    # Drawn in the target dtype: no float32 copy of a multi-GB embedding table.
    return torch.empty(spec.shape, dtype=dtype).normal_(0.0, INIT_STD, generator=gen)


def _tensor_digest(name: str, tensor) -> bytes:
    import torch

    h = hashlib.sha256(name.encode())
    h.update(str(tensor.dtype).encode())
    h.update(tensor.contiguous().view(torch.uint8).numpy().data)
    return h.digest()


def write_random_shards(
    folder: Path,
    specs: list[TensorSpec],
    *,
    seed: int,
    dtype,
    max_shard_bytes: int,
    threads: int | None = None,
    progress=None,
) -> str:
    """Write `specs` as random tensors into folder (one file, or shards plus an index, the layout
    diffusers and sglang read). Returns a sha256 over every tensor's name, dtype and bytes."""
    from safetensors.torch import save_file

    value_bytes = dtype.itemsize
    shards = plan_shards(specs, value_bytes, max_shard_bytes)
    names = shard_names(len(shards))
    threads = threads or max(1, min(16, os.cpu_count() or 1))
    weight_map: dict[str, str] = {}
    digests: dict[str, bytes] = {}

    def make(spec: TensorSpec):
        t = random_tensor(spec, seed, dtype)
        return spec.name, t, _tensor_digest(spec.name, t)

    with ThreadPoolExecutor(threads) as pool, ThreadPoolExecutor(1) as writer:
        pending = None
        for shard, file_name in zip(shards, names):
            state = {}
            for name, tensor, digest in pool.map(make, shard):
                state[name] = tensor
                digests[name] = digest
                weight_map[name] = file_name
            if pending is not None:
                pending.result()  # bounds memory: the previous shard is on disk before the next is queued
            pending = writer.submit(save_file, state, str(folder / file_name), {"format": "pt"})
            if progress is not None:
                progress(file_name, sum(s.numel for s in shard) * value_bytes)
        if pending is not None:
            pending.result()
    if len(names) > 1:
        index = {
            "metadata": {"total_size": count_params(specs) * value_bytes},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (folder / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    total = hashlib.sha256()
    for name in sorted(digests):
        total.update(digests[name])
    return total.hexdigest()
