"""What one unpickled sglang scheduler message is: a ping, a shutdown, a warmup, a message answered
here (unsupported control struct, unknown type, malformed group) or a generation request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from candidate_scheduler import protocol
from candidate_scheduler.compat.unpickle import ControlStub, PostTrainingStub, ReqStub


class Ping:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Warmup:
    """A server- or request-based warmup Req; answered at once with an empty successful OutputBatch."""

    count: int


@dataclass(frozen=True)
class Answer:
    """A message answered without the scheduler (unsupported control struct, unknown type, bad group)."""

    error: str


@dataclass(frozen=True)
class Generation:
    reqs: tuple  # of ReqStub; length > 1 only for an expand_request_outputs group


def _type_repr(obj: Any) -> str:
    """How sglang prints ``type(obj)`` in its "Unknown request type" error."""
    name = getattr(type(obj), "__sglang_class__", None)
    return f"<class '{name}'>" if isinstance(name, str) and name != "?" else repr(type(obj))


def classify(obj: Any) -> Ping | Shutdown | Warmup | Answer | Generation:
    """Sort one unpickled payload the way sglang's Scheduler does (`_normalize_received_payload`,
    `_dispatch_single_request`): Req, [Req], list[Req] (one grouped request), control structs."""
    # Only plain values are compared or truth-tested: a decoded array or tensor raises on either, and
    # small payloads are classified inside the bridge's receive loop.
    if isinstance(obj, dict) and len(obj) == 1 and isinstance(obj.get("method"), str) and obj["method"] == "ping":
        return Ping()
    if isinstance(obj, list):
        if not obj:
            return Answer("Invalid scheduler request: ValueError: request list cannot be empty")
        if len(obj) > protocol.MAX_CANDIDATES:  # first: this runs on the event loop, and a list of a
            # million memo references to one Req is a few MB of pickle
            return Answer(f"Invalid scheduler request: at most {protocol.MAX_CANDIDATES} outputs per request, "
                          f"got a group of {len(obj)}")
        if not all(isinstance(r, ReqStub) for r in obj):
            return Answer(f"Unknown request group type: {type(obj)}")
        if len(obj) == 1:
            obj = obj[0]
        else:
            if any(_is_warmup(r) for r in obj):
                return Warmup(len(obj))
            return Generation(tuple(obj))
    if isinstance(obj, ReqStub):
        if _is_warmup(obj):
            return Warmup(1)
        return Generation((obj,))
    if isinstance(obj, ControlStub) and obj.name == "ShutdownReq":
        return Shutdown()
    if isinstance(obj, (ControlStub, PostTrainingStub)):
        return Answer(f"{obj.name} is not supported by candidate_scheduler (sglang compat bridge)")
    return Answer(f"Unknown request type: {_type_repr(obj)}")


def _is_warmup(req: ReqStub) -> bool:
    extra = req.__dict__.get("extra")
    prewarm = extra.get("server_internal_prewarm") if isinstance(extra, dict) else None
    # sglang sets the flag to True; anything else that is not a plain truthy value is no warmup
    plain = isinstance(prewarm, (bool, int, float, str, bytes, list, tuple, dict))
    return req.__dict__.get("is_warmup") is True or (plain and bool(prewarm))
