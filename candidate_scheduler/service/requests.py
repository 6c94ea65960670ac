"""What a client sends: a group's SUBMIT payload, checked before it goes (`make_request`)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import numpy as np

from candidate_scheduler import protocol

_PLACEHOLDER = protocol.array_to_wire(np.zeros((1, 1, 3), np.uint8))


def make_request(
    image: np.ndarray,
    prompt: str | list[str] = "",
    *,
    request_id: str | None = None,
    count: int = 1,
    reducer: str = "mean",
    return_candidates: bool = False,
    seed: int = 42,
    seed_policy: str = "per_candidate",
    seeds: list[int] | None = None,
    min_count: int | None = None,
    deadline_s: float | None = None,
    initial_noise: np.ndarray | None = None,
    on_behalf: str | None = None,
    **sampling: Any,
) -> protocol.SubmitRequest:
    """Build a SUBMIT payload. `image`: uint8 [H, W, 3], or [B, H, W, 3] for B observations (one
    reduced action each). Sampling keywords: height, width, steps, horizon, guidance_scale,
    action_mode, domain_id, raw_action_dim, fps, negative_prompt, and for RL rollouts rollout,
    noise_level, return_step_indices. `min_count` makes the count elastic under `deadline_s` (the first n
    candidates, n in [min_count, count]). `initial_noise`: float [count, horizon, D] caller-provided x_T."""
    image = np.asarray(image)
    return checked(protocol.SubmitRequest(
        request_id=request_id or uuid.uuid4().hex,
        images=protocol.array_to_wire(image),
        prompt=prompt,
        candidates=protocol.CandidateSpecMsg(count, reducer, return_candidates, seed_policy, seeds, min_count),
        seed=seed,
        sampling=protocol.SamplingMsg(**sampling),
        batched=image.ndim == 4,
        deadline_s=deadline_s,
        initial_noise=None if initial_noise is None else protocol.array_to_wire(np.asarray(initial_noise, dtype=np.float32)),
        on_behalf=on_behalf,
    ))


def checked(request: protocol.SubmitRequest) -> protocol.SubmitRequest:
    """`request`, if the scheduler can read it; else ValueError naming what it cannot read. msgspec checks
    types when it decodes, not when a struct is built: a mistyped keyword (`height=64.0`) would travel, and
    the scheduler would answer an ERROR the caller's wait might not be the one to read."""
    probe = msgspec.structs.replace(request, images=_PLACEHOLDER, initial_noise=None)  # the arrays are checked
    try:  # when built; copying them through the codec would cost their size
        protocol.decode(protocol.Kind.SUBMIT, protocol.encode(protocol.Kind.SUBMIT, probe)[1])
    except (protocol.ProtocolError, msgspec.EncodeError, OverflowError, TypeError) as exc:
        raise ValueError(f"request {request.request_id!r} cannot be read by the scheduler: {exc}") from None
    return request


def submit_frames(request: protocol.SubmitRequest) -> list[bytes]:
    """The frames of `request`'s SUBMIT; ValueError when they are over the scheduler's message limit: its
    socket would drop the connection, and the replies of every group in flight on it would be lost."""
    frames = protocol.encode(protocol.Kind.SUBMIT, request)
    size = sum(len(f) for f in frames)
    if size > protocol.MAX_MESSAGE_BYTES:
        raise ValueError(f"request {request.request_id!r} is {size} bytes, over the scheduler's limit of "
                         f"{protocol.MAX_MESSAGE_BYTES}: send fewer or smaller observations")
    return frames


def synthetic_image(height: int = 64, width: int = 64, seed: int = 0) -> np.ndarray:
    """A deterministic test observation (no files, no downloads)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
