"""Per-candidate seeds and generator snapshots.

Seed policies (see `SeedPolicy` in spec.py; the plain strings are accepted here too):

- ``per_candidate`` (default): candidate 0 uses the base seed itself, so a count=1 group reproduces
  today's single-sample output for the same seed. Candidate i >= 1 uses
  ``splitmix64(base_seed ^ splitmix64(i)) >> 1``. splitmix64 is a bijection on 64 bits, so for two
  base seeds b != b' the 64-bit values collide only if ``splitmix64(i) ^ splitmix64(j) == b ^ b'``;
  for consecutive bases ``b ^ (b+1)`` is a run of low one-bits, which no pair of small indices
  produces (tested), so b and b+1 never share streams -- unlike ``offset``, where base b's candidate 1
  IS base b+1's candidate 0. The final ``>> 1`` keeps derived seeds in [0, 2**63): torch accepts
  seeds up to 2**64-1, but seeds also travel as int64 (numpy arrays, tensors, some msgpack
  decoders), and a value that fits a signed 64-bit integer is safe everywhere.
- ``offset``: base_seed + i, identical to sglang's ``num_outputs_per_prompt`` seeds (seed + i).
- ``explicit``: seeds[i], supplied by the caller.

Base and explicit seeds must lie in [0, 2**64), the range torch.Generator.manual_seed accepts without
reinterpretation.

Snapshots are ``torch.Generator.get_state()`` bytes behind a small header naming the device type, so a
CPU state is never silently loaded into a CUDA generator (their state layouts differ). torch is imported
lazily inside the snapshot functions: the scheduler process imports this module without torch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from candidate_scheduler.core.errors import CandidateContractError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

MASK64 = (1 << 64) - 1
SEED_LIMIT = 1 << 64  # exclusive upper bound of base and explicit seeds
DERIVED_SEED_LIMIT = 1 << 63  # exclusive upper bound of per_candidate seeds for i >= 1

_POLICIES = ("per_candidate", "offset", "explicit")


def splitmix64(x: int) -> int:
    """One splitmix64 output for state x (Steele, Lea, Flood 2014), masked to 64 bits."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def check_seed(value: object, field: str = "seed") -> int:
    """Return value if it is an int seed in [0, 2**64), else raise naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CandidateContractError(field, "invalid_seed", "seed must be an int", value)
    if not 0 <= value < SEED_LIMIT:
        raise CandidateContractError(field, "invalid_seed", "seed must be in [0, 2**64)", value)
    return value


def _policy_name(policy: object) -> str:
    # Accepts SeedPolicy members (a str Enum) and plain strings without importing spec.py.
    name = getattr(policy, "value", policy)
    if name not in _POLICIES:
        raise CandidateContractError(
            "seed_policy", "seed_policy", f"seed_policy must be one of {_POLICIES}", policy
        )
    return name


def candidate_seed(
    base_seed: int, index: int, policy: object = "per_candidate", seeds: Sequence[int] | None = None
) -> int:
    """The seed of candidate `index` under `policy` (see the module docstring)."""
    name = _policy_name(policy)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise CandidateContractError("index", "invalid_value", "index must be an int >= 0", index)
    if name == "explicit":
        if seeds is None:
            raise CandidateContractError("seeds", "seed_policy", "explicit policy needs seeds", seeds)
        if index >= len(seeds):
            raise CandidateContractError("index", "seeds_length", f"only {len(seeds)} seeds", index)
        return check_seed(seeds[index], f"seeds[{index}]")
    check_seed(base_seed, "seed")
    if name == "offset":
        return check_seed(base_seed + index, f"seed+{index}")
    if index == 0:
        return base_seed
    return splitmix64(base_seed ^ splitmix64(index)) >> 1


def candidate_seeds(
    base_seed: int, count: int, policy: object = "per_candidate", seeds: Sequence[int] | None = None
) -> tuple[int, ...]:
    """Seeds of candidates 0..count-1. With the explicit policy, `seeds` must have length count."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CandidateContractError("count", "invalid_count", "count must be an int >= 1", count)
    if _policy_name(policy) == "explicit":
        if seeds is None or len(seeds) != count:
            raise CandidateContractError(
                "seeds", "seeds_length", f"explicit policy needs exactly count={count} seeds",
                None if seeds is None else len(seeds),
            )
    return tuple(candidate_seed(base_seed, i, policy, seeds) for i in range(count))


# --- generator snapshots -------------------------------------------------------------------------

_MAGIC = b"CSG1"  # candidate-scheduler generator snapshot, format 1


def snapshot(generator: torch.Generator) -> bytes:
    """The generator's exact state as bytes: header (magic, device type) + get_state() bytes.

    Reading the state does not advance the generator.
    """
    device_type = generator.device.type.encode("ascii")
    state = generator.get_state()  # a CPU uint8 tensor for every device type
    return _MAGIC + struct.pack("B", len(device_type)) + device_type + bytes(state.numpy().tobytes())


def restore(blob: bytes, device: str = "cpu") -> torch.Generator:
    """A NEW generator on `device` in exactly the snapshotted state.

    Never mutates an existing generator: a retry must not share a generator object with an attempt
    that may still be drawing from it.
    """
    import torch

    device_type, state = _parse(blob)
    target = torch.device(device)
    if target.type != device_type:
        raise CandidateContractError(
            "snapshot", "bad_snapshot",
            f"snapshot was taken on a {device_type!r} generator, cannot restore on {device!r}", device,
        )
    generator = torch.Generator(device=target)
    try:
        generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    except RuntimeError as exc:  # wrong length or layout for this device's generator
        raise CandidateContractError("snapshot", "bad_snapshot", f"state rejected: {exc}", len(state)) from None
    return generator


def fresh_snapshot(seed: int, device: str = "cpu") -> bytes:
    """The snapshot of ``torch.Generator(device).manual_seed(seed)``: a candidate's fresh state."""
    import torch

    check_seed(seed)
    return snapshot(torch.Generator(device=device).manual_seed(seed))


def snapshot_device(blob: bytes) -> str:
    """The device type ("cpu", "cuda", ...) a snapshot was taken on."""
    return _parse(blob)[0]


def _parse(blob: bytes) -> tuple[str, bytes]:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CandidateContractError("snapshot", "bad_snapshot", "snapshot must be bytes", type(blob))
    blob = bytes(blob)
    if len(blob) < len(_MAGIC) + 1 or not blob.startswith(_MAGIC):
        raise CandidateContractError("snapshot", "bad_snapshot", "not a generator snapshot", blob[:8])
    n = blob[len(_MAGIC)]
    start = len(_MAGIC) + 1
    device_type = blob[start : start + n]
    state = blob[start + n :]
    if len(device_type) != n or not state:
        raise CandidateContractError("snapshot", "bad_snapshot", "truncated generator snapshot", len(blob))
    try:
        return device_type.decode("ascii"), state
    except UnicodeDecodeError:
        raise CandidateContractError("snapshot", "bad_snapshot", "bad device type", device_type) from None
