"""One sglang request -> one native candidate group (``protocol.SubmitRequest``).

A plain Cosmos3 policy ``Req`` (or ``[Req]``) is a group of one candidate; a ``Req`` carrying a
candidate spec is a group of N; a ``list[Req]`` from ``expand_request_outputs`` is a group of K with
one output per candidate. Anything that would change the result but cannot travel is refused with a
clear error (`UNSUPPORTED_FIELDS`). See docs/sglang-compat.md for the tables."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.images import observations
from candidate_scheduler.compat.sglang_classes import COSMOS3_SAMPLING_PARAMS
from candidate_scheduler.compat.unpickle import EnumStub, PILImageStub, ReqStub, SamplingParamsStub, SglangObject
from candidate_scheduler.core.embodiments import resolve_embodiment
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec
from candidate_scheduler.service.requests import submit_frames

# Where a candidate spec may travel inside a Req (first match wins; two different ones are an error).
CANDIDATE_SPEC_KEY = "candidates"

# Fields of a Cosmos3 policy request that the native protocol cannot carry. A value other than the one
# sglang's own action endpoint sends is refused instead of being silently ignored (it would change the
# result). (field, allowed values)
UNSUPPORTED_FIELDS: tuple[tuple[str, tuple], ...] = (
    ("video_path", (None,)),
    ("flow_shift", (None,)),
    ("action_fps", (None,)),
    ("max_sequence_length", (None,)),
    ("condition_frame_indexes", (None,)),
    ("action_view_point", ("ego_view",)),
    ("action_normalization", ("quantile",)),
    ("control_path", (None,)),
    ("action", (None,)),
    ("rollout", (False,)),
    ("return_trajectory_latents", (False,)),
    ("return_trajectory_decoded", (False,)),
    ("rollout_return_dit_trajectory", (False,)),
    ("rollout_return_denoising_env", (False,)),
    ("latents", (None,)),
    ("action_latents", (None,)),
    ("sigmas", (None,)),
    ("timesteps", (None,)),
    ("generator", (None,)),
    ("realtime_session_id", (None,)),
    # The CFG window, sound and the vision/action position sharing change the denoise; the native
    # protocol runs sglang's defaults for them. (The prompt templates are not here: sglang's tokenization
    # stage turns the system prompt and duration template off for every action request.)
    ("guidance_interval", (None,)),
    ("sound_duration", (0.0,)),
    ("share_vision_temporal_positions", (True,)),
    ("control_guidance", (1.0,)),
    ("control_guidance_interval", (None,)),
    ("control_hint", (None,)),
)


@dataclass(frozen=True)
class GroupPlan:
    """One sglang request mapped to one native group, and how to shape the answer.

    kind: "single" (a plain Req, count=1), "candidates" (a Req with a candidate spec) or "outputs"
    (a list[Req] from expand_request_outputs: one output per candidate)."""

    kind: str
    submit: protocol.SubmitRequest
    request_ids: tuple  # sglang request_id of each output entry (None allowed)
    spec: CandidateTrajectorySpec
    batched: bool
    action_mode: str
    domain_id: int
    raw_action_dim: int
    num_inference_steps: int
    num_frames: int


_MISSING = object()


def _attr(req: Any, name: str, default: Any = None) -> Any:
    try:
        return getattr(req, name)
    except AttributeError:
        return default


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # e.g. arrays: ambiguous truth value
        return False


# msgpack carries int64 (and uint64, for seeds): a larger int fails in the encoder, not as the client's error
_INT_MAX = 2**63 - 1


def _shown(value: int) -> str:
    # pickle carries ints of any size, and str() refuses one over 4300 digits (ValueError)
    if -10**40 < value < 10**40:
        return str(value)
    return f"{'a negative' if value < 0 else 'an'} int of {value.bit_length()} bits"


def _int(value: Any, name: str, minimum: int | None = None, maximum: int = _INT_MAX) -> int:
    if isinstance(value, (np.integer,)):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CompatError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise CompatError(f"{name} must be >= {minimum}, got {_shown(value)}")
    if not -_INT_MAX - 1 <= value <= maximum:
        raise CompatError(f"{name} is out of range: {_shown(value)}")
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, (np.floating, np.integer)):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CompatError(f"{name} must be a finite number")
    try:  # an int past the float range raises OverflowError here
        value = float(value)
    except OverflowError:
        raise CompatError(f"{name} must be a finite number") from None
    if not math.isfinite(value):
        raise CompatError(f"{name} must be a finite number")
    return value


def _enum_name(value: Any) -> str | None:
    return value.name if isinstance(value, EnumStub) else None


def find_candidate_spec(req: ReqStub) -> Any:
    """The raw candidate spec a Req carries, or None. Looked up, in order, at
    ``req.extra["candidates"]``, ``req.extra["diffusers_kwargs"]["candidates"]`` and
    ``req.sampling_params.diffusers_kwargs["candidates"]``; two different values are an error."""
    found = []
    extra = req.__dict__.get("extra")
    if isinstance(extra, dict):
        if CANDIDATE_SPEC_KEY in extra:
            found.append(extra[CANDIDATE_SPEC_KEY])
        dk = extra.get("diffusers_kwargs")
        if isinstance(dk, dict) and CANDIDATE_SPEC_KEY in dk:
            found.append(dk[CANDIDATE_SPEC_KEY])
    sp = req.__dict__.get("sampling_params")
    if isinstance(sp, SglangObject):
        dk = sp.__dict__.get("diffusers_kwargs")
        if isinstance(dk, dict) and CANDIDATE_SPEC_KEY in dk:
            found.append(dk[CANDIDATE_SPEC_KEY])
    if not found:
        return None
    first = found[0]
    if not all(_same(f, first) for f in found[1:]):
        raise CompatError("the Req carries two different candidate specs")
    return first


def parse_candidate_spec(raw: Any) -> CandidateTrajectorySpec:
    """A candidate spec from its wire form: an int (count) or a map with CandidateTrajectorySpec's keys
    (count, reducer, return_candidates, seed_policy, seeds)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"count": raw}
    if not isinstance(raw, dict):
        raise CompatError(f"candidate spec must be an int or a map, got {type(raw).__name__}")
    try:
        spec = CandidateTrajectorySpec.from_dict(raw)
    except CandidateContractError as exc:
        raise CompatError(f"bad candidate spec: {exc}") from None
    except ValueError:  # core's message repr()s the bad value, and repr() refuses an int over 4300 digits
        raise CompatError("bad candidate spec: a number in it is too large") from None
    if spec.count > protocol.MAX_CANDIDATES:
        raise CompatError(f"bad candidate spec: count must be at most {protocol.MAX_CANDIDATES}")
    return spec


def _is_default(value: Any, default: Any) -> bool:
    """Whether `value` is `default` as sglang reads it: the same type, or any real number equal to a
    float default (sglang keeps ``sound_duration=0`` as the int, and treats it as 0.0). A bool is no
    number here, and arrays never compare."""
    if value is default:
        return True
    if default is None:
        return False
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if isinstance(default, float) and number:
        return bool(value == default)  # exact, and no float() of a huge int
    return type(value) is type(default) and value == default


def _check_cosmos3_policy(req: ReqStub) -> None:
    sp = req.__dict__.get("sampling_params")
    if not isinstance(sp, SamplingParamsStub):
        raise CompatError("the Req has no sampling_params")
    if sp.__sglang_class__ != COSMOS3_SAMPLING_PARAMS:
        raise CompatError(f"candidate_scheduler serves Cosmos3 action requests only; got {sp.__sglang_class__}")
    mode = _attr(req, "action_mode")
    if _enum_name(_attr(req, "data_type")) != "ACTION" or mode is None:
        raise CompatError("candidate_scheduler serves Cosmos3 action requests only (action_mode='policy'); "
                          "this request generates video or images")
    if not isinstance(mode, str) or mode != "policy":
        shown = repr(mode[:50]) if isinstance(mode, str) else f"<{type(mode).__name__}>"  # str() of any value may raise
        raise CompatError(f"action_mode={shown} is not supported by candidate_scheduler; only 'policy'")
    for name, allowed in UNSUPPORTED_FIELDS:
        value = _attr(req, name, _MISSING)
        if value is _MISSING:  # a field this client's sglang does not have cannot change the result
            continue
        if not any(_is_default(value, a) for a in allowed):
            raise CompatError(f"{name} is not supported by candidate_scheduler (sglang compat bridge); "
                              f"leave it at {allowed[0]!r}")

def _prompt(req: ReqStub, batch: int) -> str | list[str]:
    prompt = _attr(req, "prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) not in (1, batch):
            raise CompatError(f"{len(prompt)} prompts for {batch} observations")
        return prompt if batch > 1 else prompt[0]
    raise CompatError("prompt must be a string (or a list of strings for batched observations)")


def _seed(value: Any, name: str = "seed") -> int:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    seed = _int(value, name, maximum=2**64 - 1)
    if not 0 <= seed < 2**64:
        raise CompatError(f"{name} must be in [0, 2**64), got {seed}")
    return seed


def _optional_int(value: Any, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _embodiment(req: ReqStub) -> tuple[int, int, str | None]:
    """(domain_id, raw_action_dim, domain_name) as sglang resolves them: domain_id wins, the width
    comes from the name when not given (`core.embodiments`)."""
    name = _attr(req, "domain_name")
    if name is not None and not isinstance(name, str):
        raise CompatError(f"domain_name must be a string, got {type(name).__name__}")
    try:
        domain_id, raw_action_dim = resolve_embodiment(_optional_int(_attr(req, "domain_id"), "domain_id"), name,
                                                       _optional_int(_attr(req, "raw_action_dim"), "raw_action_dim"))
    except ValueError as exc:
        raise CompatError(str(exc)) from None
    return domain_id, raw_action_dim, name or None


def _sampling(req: ReqStub) -> tuple[protocol.SamplingMsg, int, int]:
    height = _int(_attr(req, "height"), "height", 1)
    width = _int(_attr(req, "width"), "width", 1)
    steps = _int(_attr(req, "num_inference_steps"), "num_inference_steps", 1)
    num_frames = _int(_attr(req, "num_frames"), "num_frames", 2)
    domain_id, raw_action_dim, domain_name = _embodiment(req)
    negative = _attr(req, "negative_prompt")
    if negative is not None and not isinstance(negative, str):  # dropped, it would change a CFG result
        raise CompatError(f"negative_prompt must be a string, got {type(negative).__name__}")
    fields: dict[str, Any] = dict(
        height=height, width=width, steps=steps, horizon=num_frames - 1,
        guidance_scale=_float(_attr(req, "guidance_scale", 1.0), "guidance_scale"),
        action_mode="policy", domain_id=domain_id, raw_action_dim=raw_action_dim,
        fps=_int(_attr(req, "fps", 5), "fps", 1),
        negative_prompt=negative,
        domain_name=domain_name,  # the worker hands the name on to sglang's request builder
    )
    return protocol.SamplingMsg(**fields), steps, num_frames


def _request_id(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _native_id(base: str | None) -> str:
    tag = uuid.uuid4().hex[:12]
    return f"sglang:{base[:200]}#{tag}" if base else f"sglang:{tag}"


def _same_source(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, PILImageStub) and isinstance(b, PILImageStub):
        # fields as PILImageStub.__setstate__ sets them (a stub pickled without state has none); the EXIF
        # orientation turns the pixels, so it is compared too
        fields = ("mode", "size", "data", "palette", "info")
        va, vb = ([getattr(x, f, None) for f in fields] for x in (a, b))
        if va[-1] is None or vb[-1] is None:
            return False
        va[-1], vb[-1] = va[-1].get("exif"), vb[-1].get("exif")
        return all(_same(x, y) for x, y in zip(va, vb))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    return isinstance(a, (str, bytes, bytearray)) and _same(a, b)


def _same_observation(a: Any, b: Any) -> bool:
    """Whether two members of a group carry the same observation, compared as sent: decoding each member to
    compare pixels let a few bytes of path spellings of one large image cost a full decode per member.
    (sglang's expanded members share one image_path object.)"""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):  # a batch: one level, as images.py reads
        return len(a) == len(b) and all(_same_source(x, y) for x, y in zip(a, b))
    return _same_source(a, b)


_COMPARED_FIELDS = ("prompt", "height", "width", "num_inference_steps", "num_frames", "guidance_scale",
                    "domain_id", "domain_name", "raw_action_dim", "fps", "negative_prompt", "action_mode")


def plan_generation(reqs: tuple) -> GroupPlan:
    """Map one Req, or one expand_request_outputs group, to one native SubmitRequest."""
    if len(reqs) > protocol.MAX_CANDIDATES:  # before any per-Req work (classify checks it too)
        raise CompatError(f"at most {protocol.MAX_CANDIDATES} outputs per request")
    head = reqs[0]
    for r in reqs:
        _check_cosmos3_policy(r)
    sampling, steps, num_frames = _sampling(head)
    images, batched = observations(_attr(head, "image_path"))
    prompt = _prompt(head, images.shape[0] if batched else 1)
    rid = _request_id(_attr(head, "request_id"))
    raw_spec = find_candidate_spec(head)

    if len(reqs) == 1:
        seed = _seed(_attr(head, "seed", 42))
        if raw_spec is None:
            kind = "single"
            spec = CandidateTrajectorySpec(count=1, reducer="mean", return_candidates=True)
        else:
            kind = "candidates"
            spec = parse_candidate_spec(raw_spec)
        request_ids = (rid,)
        native_base = rid
    else:
        if any(find_candidate_spec(r) is not None for r in reqs):
            raise CompatError("a candidate spec cannot be combined with num_outputs_per_prompt > 1: "
                              "ask for one or the other")
        for r in reqs[1:]:
            for name in _COMPARED_FIELDS:
                if not _same(_attr(r, name), _attr(head, name)):
                    raise CompatError(f"a grouped request (list[Req]) must differ only in seed; {name} differs")
            if not _same_observation(_attr(r, "image_path"), _attr(head, "image_path")):
                raise CompatError("a grouped request (list[Req]) must share one observation (the same image_path)")
        seeds = [_seed(_attr(r, "seed", 42)) for r in reqs]
        seed = seeds[0]
        if all(s == seed + i for i, s in enumerate(seeds)):
            spec = CandidateTrajectorySpec(count=len(reqs), reducer="none", return_candidates=True,
                                           seed_policy="offset")
        else:
            spec = CandidateTrajectorySpec(count=len(reqs), reducer="none", return_candidates=True,
                                           seeds=tuple(seeds))
        if spec.count > protocol.MAX_CANDIDATES:
            raise CompatError(f"at most {protocol.MAX_CANDIDATES} outputs per request")
        kind = "outputs"
        request_ids = tuple(_request_id(_attr(r, "request_id")) for r in reqs)
        extra = head.__dict__.get("extra")
        parent = extra.get("parent_request_id") if isinstance(extra, dict) else None
        native_base = parent if isinstance(parent, str) else rid

    submit = protocol.SubmitRequest(
        request_id=_native_id(native_base),
        images=protocol.array_to_wire(images),
        prompt=prompt,
        candidates=protocol.CandidateSpecMsg(
            count=spec.count, reducer=spec.reducer, return_candidates=spec.return_candidates,
            seed_policy=spec.seed_policy.value, seeds=None if spec.seeds is None else list(spec.seeds),
        ),
        seed=seed,
        sampling=sampling,
        batched=batched,
        api="compat",
    )
    try:  # refused here, to this client: sent, it would cost every client its connection (images.py)
        submit_frames(submit)
    except (ValueError, OverflowError) as exc:
        raise CompatError(str(exc)) from None
    return GroupPlan(kind=kind, submit=submit, request_ids=request_ids, spec=spec, batched=batched,
                     action_mode="policy", domain_id=sampling.domain_id, raw_action_dim=sampling.raw_action_dim,
                     num_inference_steps=steps, num_frames=num_frames)
