"""What a worker is asked to run and what it gives back: plain dataclasses, no IO.

The scheduler builds `GroupWork` items from admitted groups; a worker runs a list of compatible
items as one physical batch and answers one `GroupOutput` per item plus one `BatchReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from candidate_scheduler.core.embodiments import resolve_embodiment
from candidate_scheduler.core.values import value

ACTION_MODES = ("policy",)
MAX_PROMPT_CHARS = 4096  # a prompt or a negative prompt (a text encoder reads a few hundred tokens)
DEFAULT_DOMAIN_ID = 0
DEFAULT_RAW_ACTION_DIM = 7


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@value
class SamplingSpec:
    """Sampling parameters of one group: the one definition of these fields (protocol.SamplingMsg is
    derived from it). What must match for two groups to share a batch: `batch_key`, `forward_key`."""

    height: int = 64
    width: int = 64
    steps: int = 4
    horizon: int = 16
    guidance_scale: float = 1.0
    action_mode: str = "policy"
    # The embodiment. With domain_name (an sglang embodiment such as "droid_lerobot") the id and the
    # action width resolve exactly as sglang resolves them (core/embodiments.py); without it the native
    # defaults are domain 0 and 7 action dims. After construction both are always ints.
    domain_id: int | None = None
    domain_name: str | None = None
    raw_action_dim: int | None = None
    fps: int = 5
    negative_prompt: str | None = None
    # RL rollouts: flow-SDE sampling of the action branch with per-step log-probs (see rollout.py).
    rollout: bool = False
    noise_level: float = 0.7
    return_step_indices: tuple[int, ...] | None = None  # None: every step

    def __post_init__(self) -> None:
        for name in ("height", "width"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0 or value % 16:
                raise ValueError(f"{name} must be a positive multiple of 16, got {value!r}")
        # bools are ints to Python: steps=True would run one step, guidance_scale=True a scale of 1.0
        if not _is_int(self.steps) or not 1 <= self.steps <= 1000:
            raise ValueError(f"steps must be an int in [1, 1000], got {self.steps!r}")
        if not _is_int(self.horizon) or self.horizon <= 0 or self.horizon % 4:
            # Cosmos3 needs num_frames = horizon + 1 with (num_frames - 1) % 4 == 0 (temporal VAE).
            raise ValueError(f"horizon must be a positive multiple of 4, got {self.horizon!r}")
        if not _is_number(self.guidance_scale) or not 0.0 <= self.guidance_scale <= 100.0:
            raise ValueError(f"guidance_scale must be a number in [0, 100], got {self.guidance_scale!r}")
        if self.action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {ACTION_MODES}, got {self.action_mode!r}")
        if self.domain_name is not None and (not isinstance(self.domain_name, str) or len(self.domain_name) > 64):
            raise ValueError(f"domain_name must be a string of at most 64 characters, got {self.domain_name!r}")
        if self.negative_prompt is not None and (not isinstance(self.negative_prompt, str)
                                                 or len(self.negative_prompt) > MAX_PROMPT_CHARS):
            raise ValueError(f"negative_prompt must be a string of at most {MAX_PROMPT_CHARS} characters")
        if self.domain_name:
            domain_id, raw_dim = resolve_embodiment(self.domain_id, self.domain_name, self.raw_action_dim)
        else:
            domain_id = DEFAULT_DOMAIN_ID if self.domain_id is None else self.domain_id
            raw_dim = DEFAULT_RAW_ACTION_DIM if self.raw_action_dim is None else self.raw_action_dim
        object.__setattr__(self, "domain_id", domain_id)
        object.__setattr__(self, "raw_action_dim", raw_dim)
        if not _is_int(self.domain_id) or self.domain_id < 0:
            raise ValueError(f"domain_id must be a non-negative int, got {self.domain_id!r}")
        if not _is_int(self.raw_action_dim) or self.raw_action_dim <= 0:
            raise ValueError(f"raw_action_dim must be a positive int, got {self.raw_action_dim!r}")
        if not _is_int(self.fps) or self.fps <= 0:
            raise ValueError(f"fps must be a positive int, got {self.fps!r}")
        if not isinstance(self.rollout, bool):
            raise ValueError(f"rollout must be a bool, got {self.rollout!r}")
        if not _is_number(self.noise_level) or not 0.0 < self.noise_level <= 5.0:
            # a zero noise level has no Gaussian transition, so no log-probability
            raise ValueError(f"noise_level must be in (0, 5], got {self.noise_level!r}")
        if self.return_step_indices is not None:
            idx = tuple(self.return_step_indices)
            if not idx or any(not _is_int(i) or not 0 <= i < self.steps for i in idx):
                raise ValueError(f"return_step_indices must be step indices in [0, {self.steps}), got {idx!r}")
            if list(idx) != sorted(set(idx)):
                raise ValueError(f"return_step_indices must be ascending and unique, got {idx!r}")
            object.__setattr__(self, "return_step_indices", idx)

    def batch_key(self) -> tuple:
        """What must match for two groups to share one physical batch from its first step to its last
        (dispatch-level batching): every field but those a row carries on its own."""
        key = {name: getattr(self, name) for name in _BATCH_KEY_FIELDS}
        if not self.rollout:  # rollout knobs do nothing outside a rollout
            key["noise_level"] = key["return_step_indices"] = None
        return tuple(key.values())

    def forward_key(self) -> tuple:
        """What must match for two groups to share one transformer forward at some step (step-level
        batching): the shape of a row and whether CFG doubles it. Step counts, current steps, seeds,
        prompts and guidance values may differ; text length is checked by the worker, which tokenizes."""
        return (self.height, self.width, self.horizon, self.fps, self.action_mode, self.guidance_scale > 1.0)

    def forward_label(self) -> str:
        """`forward_key` as a short string (cost-model key, wire-safe): HxW, horizon, CFG."""
        return f"{self.height}x{self.width}h{self.horizon}f{self.fps}{'+cfg' if self.guidance_scale > 1.0 else ''}"

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> SamplingSpec:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {sorted(unknown)}")
        return cls(**known)


# Row-level fields: each row carries its own (domain ids are a per-row tensor in the model).
_ROW_FIELDS = frozenset({"domain_id", "domain_name"})
_BATCH_KEY_FIELDS = tuple(f.name for f in fields(SamplingSpec) if f.name not in _ROW_FIELDS)

# The per-candidate arrays of a rollout, candidate axis first (see rollout.py); named once, here.
ROLLOUT_FIELDS = ("log_probs", "latents", "next_latents", "means", "stds", "final_latents")
# Rollout metadata that is the same for every candidate of a group and never sliced per candidate.
ROLLOUT_META_FIELDS = ("sigmas", "timesteps", "step_indices")


@value
class CandidateWork:
    """One candidate to run: its identity and where its randomness starts.

    `snapshot` (generator state bytes from `worker/generators.snapshot`) wins over `seed` when present; a retry
    always starts from one of the two, never from a generator that has already drawn."""

    candidate_id: int
    seed: int
    snapshot: bytes | None = None
    # caller-provided initial action noise x_T, [horizon, raw_action_dim] or [horizon, padded_dim]
    initial_noise: np.ndarray | None = None


@dataclass
class GroupWork:
    """A slice (or all) of one candidate group, with the group's conditioning.

    images: uint8 [B, H, W, 3] observations; prompts: one per observation."""

    request_id: str
    images: np.ndarray
    prompts: list[str]
    sampling: SamplingSpec
    candidates: list[CandidateWork]


@dataclass
class GroupOutput:
    request_id: str
    status: str  # "ok" | "cancelled" | "error"
    candidate_ids: list[int] = field(default_factory=list)
    # float32 [n_candidates, B, horizon, raw_action_dim], denormalised actions, row order = candidate_ids
    actions: np.ndarray | None = None
    error: str | None = None
    error_code: str | None = None
    # rollout mode only: name -> array with the candidate axis first (see rollout.ROLLOUT_FIELDS)
    rollout: dict[str, np.ndarray] | None = None
    # rollout mode only, the same for every candidate: sigmas [T+1], timesteps [T], step indices [S]
    rollout_meta: dict[str, np.ndarray] | None = None


@dataclass
class BatchReport:
    rows: int = 0
    condition_s: float = 0.0
    denoise_s: float = 0.0
    postprocess_s: float = 0.0
    transformer_forwards: int = 0
    text_encodes: int = 0
    vae_encodes: int = 0
    steps_run: int = 0
    peak_memory_bytes: int = 0
