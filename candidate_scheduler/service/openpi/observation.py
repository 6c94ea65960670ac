"""One openpi observation dict -> one native SubmitRequest; one native result -> one openpi reply.

Pure translation (no sockets): what the front reads, what it ignores, and the defaults it fills in.
Every field that reaches the scheduler is checked by the native wire types themselves
(`msgspec.convert` into `CandidateSpecMsg` / `SamplingMsg`), and every value the front does not set
is the native protocol's own default, so the same seed and spec give the same action on every front.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from candidate_scheduler import convert, protocol
from candidate_scheduler.core import reducers, rng
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec

IMAGE_KEYS = ("observation/image", "image")  # tried in this order, then LeRobot-style keys
LEROBOT_IMAGE_PREFIX = "observation.images."
READ_KEYS = ("prompt", "seed", "candidates", "sampling", "deadline_s")
# What openpi's LIBERO / DROID / ALOHA clients also send; listed in the metadata, never read.
KNOWN_IGNORED_KEYS = ("observation/wrist_image", "observation/state", "observation/exterior_image_1_left",
                      "observation/wrist_image_left", "observation/joint_position", "observation/gripper_position",
                      "observation.state", "state", "images")
# The reply to an openpi call carries one action chunk, not per-step rollout data: use the native
# protocol (Client.submit(rollout=True)) for RL rollouts.
ROLLOUT_KNOBS = ("rollout", "noise_level", "return_step_indices")
CANDIDATE_FIELDS = tuple(protocol.CandidateSpecMsg.__struct_fields__)
SAMPLING_FIELDS = tuple(f for f in protocol.SamplingMsg.__struct_fields__ if f not in ROLLOUT_KNOBS)
FLOAT_RANGES = ("0,1", "-1,1")
RANDOM_SEED_LIMIT = 1 << 63  # fresh seeds fit a signed 64-bit integer, like the scheduler's derived seeds


class ObservationError(ValueError):
    """An observation the front cannot turn into a native group; the message is sent to the robot."""


@dataclass(frozen=True)
class FrontDefaults:
    """Server-wide defaults. `candidates` and `sampling` hold only the fields an operator set; the
    rest stay the native protocol's defaults. `seed` None: a fresh random seed per call.
    `deadline_s` None: no deadline (an elastic count, candidates.min_count, needs one)."""

    image_key: str | None = None
    prompt: str = ""
    seed: int | None = None
    candidates: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    float_range: str = "0,1"
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.float_range not in FLOAT_RANGES:
            raise ValueError(f"float_range must be one of {FLOAT_RANGES}, got {self.float_range!r}")
        if self.image_key is not None and not (isinstance(self.image_key, str) and self.image_key):
            # "" (an unset shell variable) failed every call "no image" while the metadata named the default keys
            raise ObservationError(f"image_key must be a non-empty key, got {self.image_key!r}")
        if self.seed is not None:
            _check_seed(self.seed, "seed")
        if self.deadline_s is not None:
            _check_deadline(self.deadline_s)
        # The same checks a call gets, once at start-up: a bad default is a start-up error.
        _check_as_the_scheduler(candidate_spec(self.candidates, {}))
        sampling = sampling_msg(self.sampling, {})
        # and resolved as the scheduler (and every connection's metadata) does: an unknown domain name or a
        # horizon it cannot run would otherwise fail every call, and close every connection before its metadata
        try:
            convert.sampling_from_wire(sampling)
        except ValueError as exc:
            raise ObservationError(f"sampling: {exc}") from None

    def full_candidates(self) -> dict[str, Any]:
        return msgspec.structs.asdict(candidate_spec(self.candidates, {}))

    def full_sampling(self) -> dict[str, Any]:
        out = msgspec.structs.asdict(sampling_msg(self.sampling, {}))
        for name in ROLLOUT_KNOBS:
            out.pop(name, None)
        return out


@dataclass(frozen=True)
class Call:
    """One observation, translated."""

    submit: protocol.SubmitRequest
    image_key: str
    ignored_keys: tuple[str, ...]
    wants_candidates: bool


# ---- fields ---------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Small numpy arrays in the spec maps (seeds=np.array([...])) as the lists the wire types take."""
    if isinstance(value, np.ndarray) and value.ndim <= 1 and value.dtype.kind in "biuf":
        return value.tolist()
    return value


def _spec_map(obs: dict, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    given = obs.get(key, {})
    if not isinstance(given, dict):
        raise ObservationError(f"{key} must be a map of {list(allowed)}, got {type(given).__name__}")
    for name in given:
        if name in ROLLOUT_KNOBS and key == "sampling":
            raise ObservationError(f"sampling.{name}: rollouts are not served on the openpi front; "
                                   "use the native protocol (Client.submit(rollout=True))")
        if name not in allowed:
            raise ObservationError(f"{key}.{name} is not a field; {key} takes {list(allowed)}")
    return {name: _plain(value) for name, value in given.items()}


def candidate_spec(defaults: dict, given: dict) -> protocol.CandidateSpecMsg:
    try:
        return msgspec.convert({**defaults, **given}, protocol.CandidateSpecMsg)
    except msgspec.ValidationError as exc:
        raise ObservationError(f"candidates: {_where(exc, 'candidates')}") from None


def _check_as_the_scheduler(spec: protocol.CandidateSpecMsg) -> None:
    """ObservationError for a default spec the scheduler would refuse in every call (count, seeds, min_count).
    The reducer name is left to the scheduler: it may have registered reducers this process does not know."""
    fields = msgspec.structs.asdict(spec)
    if not reducers.is_registered(fields["reducer"]):
        fields["reducer"] = "mean"
    if isinstance(fields.get("seeds"), list):
        fields["seeds"] = tuple(fields["seeds"])
    try:
        CandidateTrajectorySpec(**fields)
    except CandidateContractError as exc:
        raise ObservationError(f"candidates: {exc}") from None
    if spec.count > protocol.MAX_CANDIDATES:
        raise ObservationError(f"candidates: count must be at most {protocol.MAX_CANDIDATES}, got {spec.count}")


def sampling_msg(defaults: dict, given: dict) -> protocol.SamplingMsg:
    # domain_name travels as given: the scheduler resolves it as sglang does (core/embodiments.py)
    try:
        return msgspec.convert({**defaults, **given}, protocol.SamplingMsg)
    except msgspec.ValidationError as exc:
        raise ObservationError(f"sampling: {_where(exc, 'sampling')}") from None


def _where(exc: msgspec.ValidationError, root: str) -> str:
    # msgspec says "... - at `$.count`"; name the observation's own path instead
    return str(exc).replace("`$.", f"`{root}.").replace("`$`", f"`{root}`")


def _check_seed(value: Any, name: str) -> int:
    try:
        return rng.check_seed(value, name)  # the scheduler's own rule, said before the call is sent
    except CandidateContractError as exc:
        raise ObservationError(str(exc)) from None


def _check_deadline(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ObservationError(f"deadline_s must be a number of seconds > 0, got {value!r}")
    return float(value)


def _prompt(obs: dict, default: str) -> str:
    prompt = obs.get("prompt", default)
    if isinstance(prompt, np.ndarray) and prompt.size == 1 and prompt.dtype.kind == "U":
        prompt = prompt.item()  # what openpi's TokenizePrompt does with a prompt that is not a str
    if not isinstance(prompt, str):
        raise ObservationError(f"prompt must be a string, got {type(prompt).__name__}")
    if len(prompt) > protocol.MAX_PROMPT_CHARS:
        raise ObservationError(f"prompt is {len(prompt)} characters; at most {protocol.MAX_PROMPT_CHARS}")
    return prompt


# ---- the image ------------------------------------------------------------------------------------


def find_image(obs: dict, image_key: str | None) -> str:
    """The key the observation's image is under."""
    if image_key is not None:
        if image_key not in obs:
            raise ObservationError(f"no image: this front reads the image from {image_key!r} (--openpi-image-key), "
                                   f"and the observation has {sorted(map(str, obs))}")
        return image_key
    for key in IMAGE_KEYS:
        if key in obs:
            return key
    lerobot = sorted(k for k in obs if isinstance(k, str) and k.startswith(LEROBOT_IMAGE_PREFIX))
    if len(lerobot) == 1:
        return lerobot[0]
    if lerobot:
        raise ObservationError(f"several images {lerobot} and no 'observation/image': start the front with "
                               "--openpi-image-key to pick one")
    raise ObservationError(f"no image: send it under 'observation/image' (or 'image', or one "
                           f"'{LEROBOT_IMAGE_PREFIX}<name>'); the observation has {sorted(map(str, obs))}")


def to_uint8_hwc(arr: Any, key: str, float_range: str) -> np.ndarray:
    """uint8 [H, W, 3] from what openpi clients send: uint8 or float, HWC or CHW. Only unambiguous
    layouts are converted; the Cosmos3 pipeline resizes and crops to height x width itself."""
    if not isinstance(arr, np.ndarray):
        raise ObservationError(f"{key} must be an array [H, W, 3], got {type(arr).__name__}")
    if arr.ndim != 3:
        raise ObservationError(f"{key} must be one image [H, W, 3] or [3, H, W], got shape {list(arr.shape)}")
    if arr.shape[-1] == 3:
        hwc = arr
    elif arr.shape[0] == 3:
        hwc = arr.transpose(1, 2, 0)
    else:
        raise ObservationError(f"{key} must be RGB, [H, W, 3] or [3, H, W]; got shape {list(arr.shape)}")
    if hwc.size == 0:  # the scheduler takes an image of no pixels (core/request.py): said here, for every dtype
        raise ObservationError(f"{key} is empty: shape {list(arr.shape)}")
    if hwc.dtype == np.uint8:
        return np.ascontiguousarray(hwc)
    if hwc.dtype.kind != "f":
        raise ObservationError(f"{key} has dtype {hwc.dtype}; send uint8 in [0, 255] or float in [{float_range}]")
    if not np.isfinite(hwc).all():
        raise ObservationError(f"{key} has NaN/inf values")
    low, high = (0.0, 1.0) if float_range == "0,1" else (-1.0, 1.0)
    lo, hi = float(hwc.min()), float(hwc.max())
    if lo < low or hi > high:
        if hi > high and hi <= 255.0 and lo >= 0.0:
            hint = " (values in [0, 255]: send the image as uint8)"
        elif float_range == "0,1" and lo >= -1.0 and hi <= 1.0:
            hint = " (images in [-1, 1]: start the front with --openpi-float-range=-1,1)"
        else:
            hint = ""
        raise ObservationError(f"{key} is float with values in [{lo:.4g}, {hi:.4g}]; this front reads float images "
                               f"in [{float_range}]{hint}")
    # rounding, not truncation: a uint8 image divided by 255 comes back exactly
    unit = hwc.astype(np.float64) if float_range == "0,1" else (hwc.astype(np.float64) + 1.0) / 2.0
    return np.ascontiguousarray(np.rint(unit * 255.0).astype(np.uint8))


# ---- translation ----------------------------------------------------------------------------------


def translate(obs: Any, defaults: FrontDefaults, request_id: str) -> Call:
    """The native group of one observation. Raises ObservationError with a message for the robot."""
    if not isinstance(obs, dict):
        raise ObservationError(f"an observation is a map (dict), got {type(obs).__name__}")
    image_key = find_image(obs, defaults.image_key)
    image = to_uint8_hwc(obs[image_key], image_key, defaults.float_range)
    prompt = _prompt(obs, defaults.prompt)
    if "seed" in obs:
        seed = _check_seed(obs["seed"], "seed")
    elif defaults.seed is not None:
        seed = defaults.seed
    else:
        seed = secrets.randbelow(RANDOM_SEED_LIMIT)
    spec = candidate_spec(defaults.candidates, _spec_map(obs, "candidates", CANDIDATE_FIELDS))
    sampling = sampling_msg(defaults.sampling, _spec_map(obs, "sampling", SAMPLING_FIELDS))
    deadline_s = _check_deadline(obs["deadline_s"]) if obs.get("deadline_s") is not None else defaults.deadline_s
    submit = protocol.SubmitRequest(
        request_id=request_id, images=protocol.array_to_wire(image), prompt=prompt, candidates=spec,
        seed=seed, sampling=sampling, deadline_s=deadline_s, api="openpi",
    )
    used = {image_key, *READ_KEYS}
    ignored = tuple(sorted(str(k) for k in obs if k not in used))
    return Call(submit, image_key, ignored, spec.return_candidates or spec.reducer == "none")


# ---- the reply ------------------------------------------------------------------------------------


class ResultError(RuntimeError):
    """A native result that is not `done`; the message is sent to the robot."""


def _served_count(result, count: int) -> int:
    # fewer than count under an elastic count (candidates.min_count with a deadline)
    served = getattr(result, "served_count", None)
    return served if served is not None else result.metrics.get("served_count", count)


def reply(call: Call, result, infer_s: float, prev_total_s: float | None = None) -> dict[str, Any]:
    """The openpi reply for a native `Result` (service.client.Result)."""
    if result.status != "done":
        code = f"{result.error_code}: " if result.error_code else ""
        raise ResultError(f"the scheduler answered {result.status}: {code}{result.error or 'no detail'}")
    timing: dict[str, float] = {"infer_ms": infer_s * 1000.0}
    if prev_total_s is not None:
        timing["prev_total_ms"] = prev_total_s * 1000.0
    scheduler: dict[str, Any] = {}
    for name, value in sorted(result.metrics.items()):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        if name.endswith("_s") and isinstance(value, (int, float)):
            timing[f"scheduler_{name[:-2]}_ms"] = float(value) * 1000.0
        else:
            scheduler[name] = value
    out: dict[str, Any] = {
        "request_id": result.request_id,
        "seed": call.submit.seed,
        "candidate_seeds": list(result.candidate_seeds),
        "served_count": int(_served_count(result, call.submit.candidates.count)),
        "reducer": call.submit.candidates.reducer,
        "server_timing": timing,
        "scheduler_metrics": scheduler,
    }
    if result.action is not None:
        out["actions"] = np.asarray(result.action, dtype=np.float32)
    if call.wants_candidates and result.candidates is not None:
        out["candidates"] = np.asarray(result.candidates, dtype=np.float32)
    if result.chosen_candidate is not None:
        out["chosen_candidate"] = int(result.chosen_candidate)
    if call.ignored_keys:
        out["ignored_keys"] = list(call.ignored_keys)
    return out
