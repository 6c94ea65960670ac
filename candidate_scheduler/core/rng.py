"""Per-candidate seeds: which seed each candidate of a group draws from (snapshots of a generator live
in worker/generators.py).

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
"""

from __future__ import annotations

from collections.abc import Sequence

from candidate_scheduler.core.errors import CandidateContractError

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
    name = _policy_name(policy)
    if name == "explicit":
        if seeds is None or len(seeds) != count:
            raise CandidateContractError(
                "seeds", "seeds_length", f"explicit policy needs exactly count={count} seeds",
                None if seeds is None else len(seeds),
            )
    elif name == "per_candidate":
        # candidate_seed's formula with the base seed checked once, not per candidate: on every group's path
        check_seed(base_seed, "seed")
        mixed = _MIXED_INDEX if count <= len(_MIXED_INDEX) else tuple(splitmix64(i) for i in range(count))
        return (base_seed, *(splitmix64(base_seed ^ mixed[i]) >> 1 for i in range(1, count)))
    return tuple(candidate_seed(base_seed, i, policy, seeds) for i in range(count))


_MIXED_INDEX = tuple(splitmix64(i) for i in range(257))  # splitmix64(index) of every index a group may have
