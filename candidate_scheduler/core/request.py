"""One submitted group: what the shell decoded (`Submission`) and what the engine admits (`GroupRequest`).

Every check of a client's request lives here, so every front (the native socket, the sglang bridge, the
openpi websocket) gets the same answer for the same mistake: a `CandidateContractError` naming the field,
or a ValueError; the engine answers either with status `invalid`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from candidate_scheduler.core import rng
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.request_scope import scoped_id
from candidate_scheduler.core.spec import MAX_REQUEST_ID_LEN, CandidateTrajectorySpec
from candidate_scheduler.core.values import value
from candidate_scheduler.core.work import MAX_PROMPT_CHARS, SamplingSpec

MAX_CANDIDATES = 256
MAX_OBSERVATIONS_PER_GROUP = 64
MAX_DEADLINE_S = 3600.0  # a deadline further out than an hour is a mistake, not a budget


@value
class Submission:
    """A SUBMIT as the shell decoded it: arrays decoded, nothing else checked yet."""

    request_id: str
    images: np.ndarray
    prompt: str | list[str] = ""
    candidates: Mapping[str, Any] | None = None  # CandidateTrajectorySpec fields
    seed: int = 42
    sampling: Mapping[str, Any] | None = None  # SamplingSpec fields
    batched: bool = False
    deadline_s: float | None = None
    initial_noise: np.ndarray | None = None  # rollouts: caller-provided x_T [count, horizon, D]
    api: str = "native"  # the API it came in by (a front's, or native): a metric label, nothing more
    scope: str | None = None  # whose request ids these are (core/request_scope.py): None, one namespace

    @property
    def scoped_id(self) -> str:
        """The group's key in the engine (read per submission: no call without keys)."""
        return self.request_id if self.scope is None else scoped_id(self.scope, self.request_id)


@value
class GroupRequest:
    """A validated group: everything a worker needs, in domain types."""

    request_id: str
    spec: CandidateTrajectorySpec
    seed: int
    sampling: SamplingSpec
    images: np.ndarray  # uint8 [B, H, W, 3]
    prompts: tuple[str, ...]  # one per observation
    batched: bool
    deadline_s: float | None
    initial_noise: np.ndarray | None  # float32 [count, horizon, D]

    @property
    def observations(self) -> int:
        return int(self.images.shape[0])

    def wire_bytes(self, candidates: int) -> int:
        """What a slice of `candidates` weighs in an assignment message, about: its observations, their
        initial noise, and room for each candidate's generator snapshot (a torch CPU one is 5 KB)."""
        noise = 0 if self.initial_noise is None else int(self.initial_noise[0].nbytes) * candidates
        return int(self.images.nbytes) + noise + 8192 * candidates


def check_request_id(request_id: Any) -> None:
    if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_REQUEST_ID_LEN:
        raise CandidateContractError(
            "request_id", "invalid_value", f"request_id must be 1..{MAX_REQUEST_ID_LEN} characters", request_id
        )


def validate(sub: Submission) -> GroupRequest:
    """Raises CandidateContractError (a field is wrong) or ValueError (the shape of the request is)."""
    check_request_id(sub.request_id)
    deadline = sub.deadline_s
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not 0.0 < deadline <= MAX_DEADLINE_S):
        raise CandidateContractError("deadline_s", "invalid_value", f"must be in (0, {MAX_DEADLINE_S:g}] seconds",
                                     sub.deadline_s)
    # checked even when explicit seeds make it unused: a request is refused or taken as a whole
    rng.check_seed(sub.seed, "seed")
    spec = _checked_once(CandidateTrajectorySpec, sub.candidates, "candidates", _spec_fields)
    if spec.count > MAX_CANDIDATES:
        raise CandidateContractError("count", "count_over_limit", f"at most {MAX_CANDIDATES}", spec.count)
    sampling = _checked_once(SamplingSpec, sub.sampling, "sampling")
    if not isinstance(sub.batched, (bool, np.bool_)):  # bool("no") is True
        raise CandidateContractError("batched", "invalid_type", "must be a bool", sub.batched)
    images = _observations(sub.images, sub.batched)
    prompts = _prompts(sub.prompt, images.shape[0])
    noise = _initial_noise(sub.initial_noise, spec, sampling)
    if sampling.rollout and spec.reducer != "none":
        raise CandidateContractError("reducer", "invalid_value", "a rollout returns every candidate; set reducer 'none'",
                                     spec.reducer)
    return GroupRequest(sub.scoped_id, spec, sub.seed, sampling, images, prompts, bool(sub.batched), sub.deadline_s,
                        noise)


_CACHED_TYPES = frozenset({str, int, float, bool, type(None)})


def _checked_once(cls: type, raw: Mapping[str, Any] | None, where: str,
                  fields: Callable[[Mapping], dict] = dict):
    """cls(**fields(raw)): a client's groups share a few specs, each checked once. The key holds each
    value's type, since 4 == 4.0 == True in Python and only the int is a valid step count; a container
    (seeds, return_step_indices) would hide its items' types, so a spec with one is checked afresh."""
    raw = {} if raw is None else raw
    if type(raw) is not dict and not isinstance(raw, Mapping):  # dict first: a Mapping check goes through abc
        raise CandidateContractError(where, "invalid_type", "must be a map", type(raw).__name__)
    items = raw.items()
    if all(type(name) is str and type(value) in _CACHED_TYPES for name, value in items):
        return _checked(cls, where, tuple(sorted((name, type(value), value) for name, value in items)))
    _known_keys(cls, raw, where)
    return cls(**fields(raw))


@functools.lru_cache(maxsize=1024)
def _checked(cls: type, where: str, key: tuple):
    kwargs = {name: value for name, _type, value in key}
    _known_keys(cls, kwargs, where)
    return cls(**kwargs)  # a bad spec raises: nothing kept


def _known_keys(cls: type, raw: Mapping, where: str) -> None:
    # cls(**raw) would raise a TypeError naming no field for a misspelt key (or a key that is no string)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    for name in raw:
        if name not in known:
            raise CandidateContractError(f"{where}.{name}", "unknown_field", f"not a field of {cls.__name__}", name)


def _spec_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    fields = dict(raw)
    if isinstance(fields.get("seeds"), list):  # tuple() of anything else (a map: its keys) hides the mistake
        fields["seeds"] = tuple(fields["seeds"])
    return fields


def _observations(images: np.ndarray, batched: bool) -> np.ndarray:
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {images.dtype}")
    if batched:
        if images.ndim != 4:
            raise ValueError(f"batched images must be [B, H, W, 3], got shape {list(images.shape)}")
    else:
        if images.ndim != 3:
            raise ValueError(f"images must be [H, W, 3] (set batched for [B, H, W, 3]), got shape {list(images.shape)}")
        images = images[None]
    if images.shape[0] > MAX_OBSERVATIONS_PER_GROUP:
        raise ValueError(f"at most {MAX_OBSERVATIONS_PER_GROUP} observations per group, got {images.shape[0]}")
    if images.shape[0] < 1 or images.shape[-1] != 3:
        raise ValueError(f"images must have 3 channels and at least one observation, got shape {list(images.shape)}")
    if images.shape[1] < 1 or images.shape[2] < 1:  # admitted, an image of no pixels failed on the worker
        raise ValueError(f"images must have at least one pixel, got shape {list(images.shape)}")
    return images


def _prompts(prompt: Any, n: int) -> tuple[str, ...]:
    if not isinstance(prompt, (str, list, tuple)):
        raise ValueError(f"prompt must be a string or a list of strings, got {type(prompt).__name__}")
    prompts = [prompt] * n if isinstance(prompt, str) else list(prompt)
    if len(prompts) == 1:
        prompts = prompts * n
    if len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompt(s) for {n} observation(s)")
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError("prompts must be strings")
        if len(p) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt longer than {MAX_PROMPT_CHARS} characters")
    return tuple(prompts)


def _initial_noise(noise: np.ndarray | None, spec: CandidateTrajectorySpec, sampling: SamplingSpec) -> np.ndarray | None:
    if noise is None:
        return None
    if not isinstance(noise, np.ndarray):
        raise ValueError(f"initial_noise must be an array, got {type(noise).__name__}")
    want = (spec.count, sampling.horizon)
    if noise.dtype not in (np.float32, np.float64) or noise.ndim != 3 or noise.shape[:2] != want:
        raise ValueError(f"initial_noise must be float [count={want[0]}, horizon={want[1]}, D], got "
                         f"{noise.dtype}{list(noise.shape)}")
    if noise.shape[2] < sampling.raw_action_dim:
        raise ValueError(f"initial_noise has {noise.shape[2]} action dims, raw_action_dim is {sampling.raw_action_dim}")
    if not np.all(np.isfinite(noise)):
        raise ValueError("initial_noise must be finite")
    return noise.astype(np.float32)
