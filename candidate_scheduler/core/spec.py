"""The candidate contract: what a request asks for and what a model adapter declares.

Frozen dataclasses validated in ``__post_init__``; every violation raises `CandidateContractError`
naming the field. ``to_dict``/``from_dict`` give msgpack-friendly maps (lists for tuples) and
round-trip exactly; ``from_dict`` refuses unknown keys, because a misspelt optional key on the wire
would otherwise silently fall back to a default.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import MISSING, field, fields
from typing import Any

import numpy as np

from candidate_scheduler.core import reducers, rng
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.values import value

MAX_REQUEST_ID_LEN = 256
ACTION_DTYPES = ("float16", "bfloat16", "float32", "float64")


class SeedPolicy(str, enum.Enum):
    PER_CANDIDATE = "per_candidate"
    OFFSET = "offset"
    EXPLICIT = "explicit"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(name: str, value: object, minimum: int, code: str = "invalid_value") -> None:
    if not _is_int(value):
        raise CandidateContractError(name, "invalid_type", "must be an int", value)
    if value < minimum:
        raise CandidateContractError(name, code, f"must be >= {minimum}", value)


def _require_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise CandidateContractError(name, "invalid_type", "must be a bool", value)


def _require_str(name: str, value: object, *, max_len: int = MAX_REQUEST_ID_LEN) -> None:
    if not isinstance(value, str) or not value:
        raise CandidateContractError(name, "invalid_value", "must be a non-empty string", value)
    if len(value) > max_len:
        raise CandidateContractError(name, "invalid_value", f"must be at most {max_len} characters", value)


def _str_tuple(name: str, value: object, *, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise CandidateContractError(name, "invalid_type", "must be a sequence of strings", value)
    items = tuple(value)
    if not items and not allow_empty:
        raise CandidateContractError(name, "invalid_value", "must not be empty", value)
    for i, item in enumerate(items):
        _require_str(f"{name}[{i}]", item, max_len=64)
    if len(set(items)) != len(items):
        raise CandidateContractError(name, "invalid_value", "must not repeat entries", value)
    return items


def _check_keys(cls: type, data: Mapping[str, Any]) -> None:
    if not isinstance(data, Mapping):
        raise CandidateContractError(cls.__name__, "invalid_type", "must be a map", data)
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise CandidateContractError(str(key), "unknown_field", f"not a field of {cls.__name__}", key)
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING and f.name not in data:
            raise CandidateContractError(f.name, "invalid_value", f"required field of {cls.__name__} is missing")


@value
class CandidateTrajectorySpec:
    """How many candidates a request wants and how they become one action.

    Passing `seeds` with the default policy means the explicit policy (it is set for you); passing
    seeds with any other policy, or the explicit policy without seeds, is an error.
    ``reducer="none"`` returns every candidate and serves no single action.

    `min_count` makes the count elastic: under a deadline the scheduler may serve candidates
    0..n-1 only, for the largest n in [min_count, count] it predicts will meet the deadline (they are
    bitwise the first n of the full group). None means count: not elastic.
    """

    count: int = 1
    reducer: str = "mean"
    return_candidates: bool = False
    seed_policy: SeedPolicy = SeedPolicy.PER_CANDIDATE
    seeds: tuple[int, ...] | None = None
    min_count: int | None = None

    def __post_init__(self) -> None:
        _require_int("count", self.count, 1, code="invalid_count")
        if self.min_count is None:
            object.__setattr__(self, "min_count", self.count)
        _require_int("min_count", self.min_count, 1, code="invalid_count")
        if self.min_count > self.count:
            raise CandidateContractError("min_count", "invalid_count", f"must be <= count={self.count}",
                                         self.min_count)
        if not reducers.is_registered(self.reducer):
            raise CandidateContractError(
                "reducer", "unknown_reducer", f"registered reducers are {reducers.registered_reducers()}",
                self.reducer,
            )
        _require_bool("return_candidates", self.return_candidates)
        try:
            policy = SeedPolicy(self.seed_policy)
        except ValueError:
            raise CandidateContractError(
                "seed_policy", "seed_policy", f"must be one of {[p.value for p in SeedPolicy]}", self.seed_policy
            ) from None
        seeds = self.seeds
        if seeds is not None:
            if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (tuple, list)):
                raise CandidateContractError("seeds", "invalid_type", "must be a sequence of ints", seeds)
            seeds = tuple(seeds)
            if policy is SeedPolicy.PER_CANDIDATE:
                policy = SeedPolicy.EXPLICIT
            elif policy is not SeedPolicy.EXPLICIT:
                raise CandidateContractError(
                    "seeds", "seed_policy", f"seeds given but seed_policy is {policy.value!r}", policy.value
                )
            if len(seeds) != self.count:
                raise CandidateContractError(
                    "seeds", "seeds_length", f"need exactly count={self.count} seeds", len(seeds)
                )
            for i, seed in enumerate(seeds):
                rng.check_seed(seed, f"seeds[{i}]")
        elif policy is SeedPolicy.EXPLICIT:
            raise CandidateContractError("seeds", "seed_policy", "seed_policy 'explicit' needs seeds", None)
        object.__setattr__(self, "seed_policy", policy)
        object.__setattr__(self, "seeds", seeds)

    def candidate_seeds(self, base_seed: int) -> tuple[int, ...]:
        """Seeds of candidates 0..count-1 for this request's base seed (ignored when explicit)."""
        return rng.candidate_seeds(base_seed, self.count, self.seed_policy, self.seeds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "reducer": self.reducer,
            "return_candidates": self.return_candidates,
            "seed_policy": self.seed_policy.value,
            "seeds": None if self.seeds is None else list(self.seeds),
            "min_count": self.min_count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CandidateTrajectorySpec:
        _check_keys(cls, data)
        return cls(**dict(data))


@value
class EquivalenceRule:
    """How parity checks compare candidate actions: dtype of comparison, tolerances, and whether the
    model promises bitwise equality on CPU (batched == microbatched == sequential)."""

    dtype: str = "float32"
    atol: float = 0.0
    rtol: float = 0.0
    bitwise_on_cpu: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ACTION_DTYPES:
            raise CandidateContractError("equivalence.dtype", "invalid_value", f"must be one of {ACTION_DTYPES}", self.dtype)
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise CandidateContractError(f"equivalence.{name}", "invalid_value", "must be a finite float >= 0", value)
            object.__setattr__(self, name, float(value))
        _require_bool("equivalence.bitwise_on_cpu", self.bitwise_on_cpu)

    def close(self, a: Any, b: Any, *, cpu: bool = False) -> bool:
        """Whether two candidate actions are equivalent under this rule.

        Shapes must match exactly (no broadcasting) and NaN never equals anything. With ``cpu=True``
        and a model that promises bitwise CPU parity, equality must be exact.
        """
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if cpu and self.bitwise_on_cpu:
            return bool(np.array_equal(a, b))
        return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=self.rtol, atol=self.atol, equal_nan=False))

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "atol": self.atol, "rtol": self.rtol, "bitwise_on_cpu": self.bitwise_on_cpu}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EquivalenceRule:
        _check_keys(cls, data)
        return cls(**dict(data))


@value
class ModelCapability:
    """What a model adapter declares about its candidate action path.

    `reducers` are the reducer names the model has validated (``none`` is always allowed on top);
    they must also be registered in the scheduler process, which reduces. `action_shape` uses None for
    variable dimensions. `max_candidates_per_group` is a hard limit even with microbatching.
    """

    model_name: str
    action_tensor: str = "action_latents"
    action_shape: tuple[int | None, ...] = (None, None)
    action_dtype: str = "float32"
    reduce_after_denormalize: bool = True
    reducers: tuple[str, ...] = ("mean", "median", "medoid")
    action_modes: tuple[str, ...] = ("policy",)
    candidate_invariant: tuple[str, ...] = ()
    auxiliary_branch_required: bool = False
    max_candidates_per_batch: int = 8
    max_candidates_per_group: int = 64
    equivalence: EquivalenceRule = field(default_factory=EquivalenceRule)

    def __post_init__(self) -> None:
        _require_str("model_name", self.model_name)
        _require_str("action_tensor", self.action_tensor, max_len=128)
        shape = self.action_shape
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
            raise CandidateContractError("action_shape", "invalid_type", "must be a sequence", shape)
        shape = tuple(shape)
        for i, dim in enumerate(shape):
            if dim is not None:
                _require_int(f"action_shape[{i}]", dim, 1)
        object.__setattr__(self, "action_shape", shape)
        if self.action_dtype not in ACTION_DTYPES:
            raise CandidateContractError("action_dtype", "invalid_value", f"must be one of {ACTION_DTYPES}", self.action_dtype)
        _require_bool("reduce_after_denormalize", self.reduce_after_denormalize)
        _require_bool("auxiliary_branch_required", self.auxiliary_branch_required)
        object.__setattr__(self, "reducers", _str_tuple("reducers", self.reducers, allow_empty=True))
        object.__setattr__(self, "action_modes", _str_tuple("action_modes", self.action_modes, allow_empty=False))
        object.__setattr__(
            self, "candidate_invariant", _str_tuple("candidate_invariant", self.candidate_invariant, allow_empty=True)
        )
        _require_int("max_candidates_per_batch", self.max_candidates_per_batch, 1)
        _require_int("max_candidates_per_group", self.max_candidates_per_group, 1)
        if not isinstance(self.equivalence, EquivalenceRule):
            raise CandidateContractError("equivalence", "invalid_type", "must be an EquivalenceRule", self.equivalence)

    def supports_reducer(self, name: str) -> bool:
        return name == reducers.NO_REDUCTION or name in self.reducers

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "action_tensor": self.action_tensor,
            "action_shape": list(self.action_shape),
            "action_dtype": self.action_dtype,
            "reduce_after_denormalize": self.reduce_after_denormalize,
            "reducers": list(self.reducers),
            "action_modes": list(self.action_modes),
            "candidate_invariant": list(self.candidate_invariant),
            "auxiliary_branch_required": self.auxiliary_branch_required,
            "max_candidates_per_batch": self.max_candidates_per_batch,
            "max_candidates_per_group": self.max_candidates_per_group,
            "equivalence": self.equivalence.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelCapability:
        _check_keys(cls, data)
        kwargs = dict(data)
        if "equivalence" in kwargs:
            kwargs["equivalence"] = EquivalenceRule.from_dict(kwargs["equivalence"])
        return cls(**kwargs)
