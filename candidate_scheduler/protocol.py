"""Wire types of the native sockets: typed msgpack (msgspec), a header frame, size limits. No pickle.

Every native message is two frames after the ZMQ routing envelope:

    [header, payload]    header = bytes([PROTOCOL_VERSION, kind]); payload = msgpack of the kind's struct

A REQ client adds an empty delimiter frame; the server accepts both shapes. Each kind has exactly one
typed decoder, so a payload that does not match its kind is a typed error, never a guess.
"""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any

import msgspec
import numpy as np

from candidate_scheduler.core import request
from candidate_scheduler.core.spec import CandidateTrajectorySpec
from candidate_scheduler.core.work import ROLLOUT_FIELDS, SamplingSpec

PROTOCOL_VERSION = 1

# Size limits. The ZMQ socket option MAXMSGSIZE enforces the first before any byte is decoded.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_OBSERVATION_BYTES = 32 * 1024 * 1024
MAX_CANDIDATES, MAX_REQUEST_ID_LEN, MAX_PROMPT_CHARS = request.MAX_CANDIDATES, request.MAX_REQUEST_ID_LEN, request.MAX_PROMPT_CHARS

# Entries of a list or map field, far above what a valid message holds. msgspec checks the bound from the
# container's header, before it builds an entry: without one, a 60 MB list of tiny entries decoded to
# ~460 MB of objects, and a map of millions of names held the loop for seconds (past the workers'
# heartbeat timeout). A count over the field's real limit but under these still gets its field-level
# answer (core/request.py); only a message no client or worker sends is refused here.
MAX_DIMS = 64  # an array's shape (array_from_wire takes 8)
MAX_ITEMS = 4096  # a group's prompts (64), seeds (256), step indices (1000); a slice's candidate ids; forwards
MAX_IDS = 65536  # assignment ids a worker names; the outputs of one assignment
MAX_KEYS = 1024  # the names in a map: a capability, a report, cache counters, compat counts
MAX_ROLLOUT_ARRAYS = 64  # the arrays of a slice's rollout, and of its metadata (6 and 3 in a valid one)


def _most(t: Any, n: int) -> Any:
    return Annotated[t, msgspec.Meta(max_length=n)]


class Kind(enum.IntEnum):
    # client -> scheduler, request socket
    SUBMIT = 0x01
    PING = 0x02
    # client -> scheduler, control socket
    CANCEL = 0x10
    STATUS = 0x11
    STATS = 0x12
    DRAIN = 0x13
    SHUTDOWN = 0x14
    COMPAT_REPORT = 0x15  # the sglang compat bridge's message counts, for the scheduler's /metrics
    WORKER_LEAVE = 0x16  # an operator asks one worker to leave (it finishes what it holds, then goes)
    # worker <-> scheduler, worker link
    REGISTER = 0x20
    HEARTBEAT = 0x21
    BATCH = 0x22
    BATCH_RESULT = 0x23
    CANCEL_ROWS = 0x24
    REGISTERED = 0x25
    WORKER_STOP = 0x26
    JOIN = 0x27  # like BATCH, sent to a busy worker: join its running batch at the next step boundary
    LEAVING = 0x28  # the worker is going (SIGTERM): send it nothing more; it finishes what it holds
    LEAVE_ACK = 0x29  # the scheduler's answer: the assignments it counts on the worker to finish
    LEFT = 0x2A  # the worker's last message: forget it now, not after its heartbeats lapse
    GIVE_BACK = 0x2B  # a leaving worker's assignments it has not started: run them elsewhere now
    # scheduler -> client
    RESULT = 0x80
    ERROR = 0x81
    CONTROL_REPLY = 0x82
    PONG = 0x83


class ProtocolError(ValueError):
    """A frame or payload that cannot be decoded. `kind` is a bounded metrics label."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):  # pickled (out of a worker process) with both arguments, not its message alone
        return type(self), (self.kind, str(self))


class Array(msgspec.Struct, frozen=True):
    """A tensor on the wire: dtype name, shape, raw little-endian bytes."""

    dtype: str
    shape: _most(list[int], MAX_DIMS)
    data: bytes


ALLOWED_DTYPES = ("uint8", "float32", "float64", "int64", "int32", "float16")
# numpy's dtype.name is computed on every access and np.dtype(name) parses its argument: both on the
# path of every array that travels, so the mappings are made once.
_NAME_OF = {np.dtype(n): n for n in ALLOWED_DTYPES}
_LITTLE = {n: np.dtype(n).newbyteorder("<") for n in ALLOWED_DTYPES}
_NATIVE_IS_LITTLE = np.dtype("<f4") == np.dtype("f4")


def array_to_wire(arr: np.ndarray) -> Array:
    arr = np.ascontiguousarray(arr)
    name = _NAME_OF.get(arr.dtype)
    if name is None:
        raise ProtocolError("bad_type", f"dtype {arr.dtype} cannot travel; allowed: {ALLOWED_DTYPES}")
    if not _NATIVE_IS_LITTLE:
        arr = arr.astype(_LITTLE[name], copy=False)
    # An array decoded from the wire is a view of the message's bytes: send those bytes again, uncopied.
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    data = base if isinstance(base, bytes) and len(base) == arr.nbytes else arr.tobytes()
    return Array(name, list(arr.shape), data)


def array_from_wire(a: Array, *, max_bytes: int = MAX_MESSAGE_BYTES) -> np.ndarray:
    dtype = _LITTLE.get(a.dtype)
    if dtype is None:
        raise ProtocolError("bad_type", f"dtype {a.dtype!r} not allowed; allowed: {ALLOWED_DTYPES}")
    if len(a.shape) > 8 or any((not isinstance(d, int)) or d < 0 for d in a.shape):
        raise ProtocolError("bad_type", f"bad array shape {a.shape!r}")
    # Python ints: an int64 product of hostile dims would wrap around and slip past the size check
    expected = math.prod(a.shape) * dtype.itemsize
    if expected > max_bytes:
        raise ProtocolError("oversize", f"array of {expected} bytes is over the {max_bytes}-byte limit")
    if max(a.shape, default=0) > 2**31:  # beside a 0 the byte count checks out, and numpy's reshape refuses it
        raise ProtocolError("bad_type", f"bad array shape {a.shape!r}")
    if expected != len(a.data):
        raise ProtocolError("bad_type", f"array data has {len(a.data)} bytes, shape {a.shape} needs {expected}")
    arr = np.frombuffer(a.data, dtype=dtype).reshape(a.shape)
    return arr if _NATIVE_IS_LITTLE else arr.astype(dtype.newbyteorder("="), copy=False)


# ---- client <-> scheduler -------------------------------------------------------------------------


def _wire_struct(name: str, source: type, overrides: dict[str, Any] | None = None) -> type:
    """A frozen msgspec struct with the fields (names, types, defaults) of a core dataclass: the core
    type stays the one definition; unknown fields on the wire are an error, never silently dropped."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(source)
    hints.update(overrides or {})
    spec = [(f.name, hints[f.name], getattr(f.default, "value", f.default)) for f in dataclasses.fields(source)]
    return msgspec.defstruct(name, spec, forbid_unknown_fields=True, frozen=True, module=__name__)


# The sampling fields of a group: SamplingSpec's, field for field (convert.py maps one to the other).
SamplingMsg = _wire_struct("SamplingMsg", SamplingSpec, {"return_step_indices": _most(list[int], MAX_ITEMS) | None})
# A group's candidate spec: CandidateTrajectorySpec's fields (its checks run in core/request.py).
CandidateSpecMsg = _wire_struct("CandidateSpecMsg", CandidateTrajectorySpec,
                                {"seed_policy": str, "seeds": _most(list[int], MAX_ITEMS) | None})


class SubmitRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One logical request: a candidate group over one observation (or a batch of B observations).

    images: one Array [H, W, 3] uint8, or [B, H, W, 3] when `batched` is true (one reduced action
    per observation). deadline_s: seconds from arrival after which the group expires."""

    request_id: str
    images: Array
    prompt: str | _most(list[str], MAX_ITEMS) = ""
    candidates: CandidateSpecMsg = CandidateSpecMsg()
    seed: int = 42
    sampling: SamplingMsg = SamplingMsg()
    batched: bool = False
    deadline_s: float | None = None
    # rollout mode: caller-provided initial action noise x_T, [count, horizon, raw_action_dim]
    initial_noise: Array | None = None
    # a front that authenticated its own client (a proxy key, core/access.py) names it: its tenant applies
    on_behalf: str | None = None
    # the API the group came in by, a metric label only (groups_received_total{api}): a front sets its
    # own ("compat": sglang's clients, "openpi"); a value outside the label's set counts as "other"
    api: str = "native"


# Per-candidate rollout data (candidate axis first; S = returned steps) plus group-level metadata that is
# never sliced per candidate. log_probs [N, S] float32: log N(x_next; mean, std^2) summed over the active
# action dims; latents / next_latents / means [N, S, H, D]: x_t entering each returned step, x after it,
# the Gaussian mean (normalised action space); stds [N, S]; final_latents [N, H, D]; sigmas [T+1]: the
# scheduler's own sigmas (post-shift, final 0); timesteps [T]. Align per-step data by absolute step index:
# entry s belongs to step step_indices[s], whose sigma is sigmas[step_indices[s]] and whose target sigma
# is sigmas[step_indices[s] + 1].
RolloutResult = msgspec.defstruct(
    "RolloutResult",
    [(name, Array) for name in ROLLOUT_FIELDS] + [("sigmas", Array), ("timesteps", Array), ("step_indices", list[int])],
    frozen=True, module=__name__,
)


class GroupResult(msgspec.Struct, frozen=True):
    """The one reply a group gets. status: done | failed | cancelled | expired | rejected |
    overloaded | invalid. `action` is the reduced action ([H, D], or [B, H, D] when batched); it is
    None unless status is done and the reducer is not "none". `candidates` holds every candidate
    ([N, H, D] or [N, B, H, D]) when asked for or when the reducer is "none"."""

    request_id: str
    status: str
    action: Array | None = None
    candidates: Array | None = None
    candidate_seeds: list[int] = []
    chosen_candidate: int | None = None
    error: str | None = None
    error_code: str | None = None
    metrics: dict[str, Any] = {}
    rollout: RolloutResult | None = None
    served_count: int | None = None  # candidates served: fewer than requested under an elastic count


class Ping(msgspec.Struct, frozen=True):
    nonce: int = 0


class Pong(msgspec.Struct, frozen=True):
    nonce: int = 0
    protocol_version: int = PROTOCOL_VERSION
    # This run of the scheduler (random at start; "" from a server that does not say): a client whose
    # scheduler answers with another one knows it restarted, and lost the groups sent to the run before
    incarnation: str = ""


class ErrorReply(msgspec.Struct, frozen=True):
    """A message that could not be taken at all (bad frames, bad msgpack, wrong kind)."""

    error: str
    error_code: str
    request_id: str | None = None


# ---- control socket -----------------------------------------------------------------------------


class CancelRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    request_id: str
    # whose request id (core/request_scope.py): None, the sender's own; an admin names another principal.
    # Without keys there is one namespace and this is not read. (omitted when None: the bytes stay as before)
    principal: str | None = None


class StatusRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    request_id: str
    principal: str | None = None  # as CancelRequest's


class WorkerLeaveRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    worker_id: str


class Empty(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class CompatReport(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Counts since the bridge's last report: sglang messages by type, refusals by kind."""

    requests: _most(dict[str, int], MAX_KEYS) = {}
    errors: _most(dict[str, int], MAX_KEYS) = {}


class ControlReply(msgspec.Struct, frozen=True):
    ok: bool
    changed: bool = False
    state: str | None = None
    detail: dict[str, Any] = {}
    error: str | None = None
    error_code: str | None = None  # "forbidden": not this principal's right (core/access.py)


# ---- worker link ----------------------------------------------------------------------------------


class RegisterMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    worker_id: str
    capability: _most(dict[str, Any], MAX_KEYS)
    capacity: int
    memory_budget_bytes: int = 0
    device: str = "cpu"
    pid: int = 0
    profile: _most(list[tuple[str, int, float]], MAX_ITEMS) = []  # warm-up forwards: (forward label, rows, seconds)
    conditioning: str = "inline"  # "thread": groups that join are conditioned beside the running batch's steps


class RegisteredMsg(msgspec.Struct, frozen=True):
    worker_id: str
    heartbeat_interval_s: float


class HeartbeatMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    worker_id: str
    busy_batch: int | None = None  # the first of `running` (kept for older readers)
    step: int | None = None
    running: _most(list[int], MAX_IDS) = []  # every assignment id the worker holds, queued or in its running batch
    # (rows, seconds, forward label) of each forward since the last one (a worker keeps its last 1024)
    forwards: _most(list[tuple[int, float, str]], MAX_ITEMS) = []
    cache: _most(dict[str, int], MAX_KEYS) = {}  # conditioning cache: counter increments since the last heartbeat, and "bytes" in use


class CandidateMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    candidate_id: int
    seed: int
    snapshot: bytes | None = None
    initial_noise: Array | None = None


class GroupWorkMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    request_id: str
    images: Array  # [B, H, W, 3] uint8
    prompts: list[str]
    sampling: SamplingMsg
    candidates: list[CandidateMsg]


# An assignment id as a worker reads it: the worker frames its answers with the id as 8 unsigned bytes,
# so one outside that range is refused when the BATCH or JOIN is decoded (the scheduler's are counters).
AssignmentId = Annotated[int, msgspec.Meta(ge=0)]  # msgpack carries no int of 2**64 or more


class BatchMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    batch_id: AssignmentId
    groups: list[GroupWorkMsg]
    # The rows the worker may run at once, as the scheduler counts them now, when that is fewer than the
    # worker registered with (it ran out of memory, or its memory budget caps it); 0: its own capacity.
    # Left out when 0, so a worker of the release before reads every assignment it could before.
    rows: int = 0


class GroupOutputMsg(msgspec.Struct, frozen=True):
    request_id: str
    status: str
    candidate_ids: _most(list[int], MAX_ITEMS) = []
    actions: Array | None = None
    error: str | None = None
    error_code: str | None = None
    rollout: _most(dict[str, Array], MAX_ROLLOUT_ARRAYS) | None = None
    rollout_meta: _most(dict[str, Array], MAX_ROLLOUT_ARRAYS) | None = None


class BatchResultMsg(msgspec.Struct, frozen=True):
    worker_id: str
    batch_id: int
    outputs: _most(list[GroupOutputMsg], MAX_IDS)
    report: _most(dict[str, Any], MAX_KEYS) = {}


class CancelRowsMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    batch_id: int
    request_ids: list[str]


class WorkerStopMsg(msgspec.Struct, frozen=True):
    reason: str = ""


class LeavingMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    worker_id: str
    grace_s: float  # how long the worker gives what it holds to finish before it goes anyway


class LeaveAckMsg(msgspec.Struct, frozen=True):
    batch_ids: list[int]  # every assignment the scheduler has sent the worker and not had answered
    # the scheduler takes GIVE_BACK: unstarted work may be handed back (absent from an older one, which
    # would drop the message and count the work unfinished)
    give_back: bool = False


class LeftMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    worker_id: str
    reason: str  # "finished" (it answered every assignment), "grace_expired", "no_ack"


class GiveBackMsg(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    worker_id: str
    batch_ids: _most(list[int], MAX_IDS)  # assignments it holds and will not run: none of their groups started here


PAYLOAD_TYPES: dict[Kind, type] = {
    Kind.SUBMIT: SubmitRequest,
    Kind.PING: Ping,
    Kind.CANCEL: CancelRequest,
    Kind.STATUS: StatusRequest,
    Kind.STATS: Empty,
    Kind.DRAIN: Empty,
    Kind.SHUTDOWN: Empty,
    Kind.COMPAT_REPORT: CompatReport,
    Kind.WORKER_LEAVE: WorkerLeaveRequest,
    Kind.REGISTER: RegisterMsg,
    Kind.HEARTBEAT: HeartbeatMsg,
    Kind.BATCH: BatchMsg,
    Kind.BATCH_RESULT: BatchResultMsg,
    Kind.JOIN: BatchMsg,
    Kind.CANCEL_ROWS: CancelRowsMsg,
    Kind.REGISTERED: RegisteredMsg,
    Kind.WORKER_STOP: WorkerStopMsg,
    Kind.LEAVING: LeavingMsg,
    Kind.LEAVE_ACK: LeaveAckMsg,
    Kind.LEFT: LeftMsg,
    Kind.GIVE_BACK: GiveBackMsg,
    Kind.RESULT: GroupResult,
    Kind.ERROR: ErrorReply,
    Kind.CONTROL_REPLY: ControlReply,
    Kind.PONG: Pong,
}
_DECODERS = {kind: msgspec.msgpack.Decoder(t) for kind, t in PAYLOAD_TYPES.items()}
_ENCODER = msgspec.msgpack.Encoder()


def header(kind: Kind) -> bytes:
    return bytes([PROTOCOL_VERSION, int(kind)])


def encode(kind: Kind, payload: msgspec.Struct) -> list[bytes]:
    """The two frames of one message."""
    if not isinstance(payload, PAYLOAD_TYPES[kind]):
        raise TypeError(f"{kind.name} carries {PAYLOAD_TYPES[kind].__name__}, not {type(payload).__name__}")
    return [header(kind), _ENCODER.encode(payload)]


def parse_header(frame: bytes, allowed: frozenset[Kind] | set[Kind]) -> Kind:
    if len(frame) != 2:
        raise ProtocolError("bad_frames", f"header frame must be 2 bytes, got {len(frame)}")
    version, raw_kind = frame[0], frame[1]
    if version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"protocol version {version} is not supported (this is {PROTOCOL_VERSION})")
    try:
        kind = Kind(raw_kind)
    except ValueError:
        raise ProtocolError("unknown_kind", f"unknown message kind 0x{raw_kind:02x}") from None
    if kind not in allowed:
        raise ProtocolError("unknown_kind", f"message kind {kind.name} is not accepted on this socket")
    return kind


def decode(kind: Kind, payload: bytes) -> Any:
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError("oversize", f"payload of {len(payload)} bytes is over {MAX_MESSAGE_BYTES}")
    try:
        return _DECODERS[kind].decode(payload)
    except msgspec.ValidationError as exc:
        raise ProtocolError("bad_type", f"{kind.name} payload does not match its schema: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError("bad_msgpack", f"{kind.name} payload is not valid msgpack: {exc}") from None
    except RecursionError:
        # msgspec recurses while skipping an unknown, deeply nested field of a struct that ignores them
        raise ProtocolError("bad_msgpack", f"{kind.name} payload nests too deeply") from None


class _Named(msgspec.Struct):
    """Only the request id of a message that names one (other fields skipped unread)."""

    request_id: str


_NAMED = msgspec.msgpack.Decoder(_Named)


def request_id_of(payload: bytes) -> str | None:
    """The request id an unreadable message names, if it names a readable one: its ERROR can then say
    which group it was about (a client with several in flight could not tell otherwise)."""
    if len(payload) > MAX_MESSAGE_BYTES:
        return None
    try:
        rid = _NAMED.decode(payload).request_id
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return rid if 0 < len(rid) <= MAX_REQUEST_ID_LEN else None


def split_envelope(frames: list[bytes], allowed) -> tuple[bytes, bool, Kind, bytes]:
    """ROUTER frames -> (identity, had_delimiter, kind, payload). Raises ProtocolError with the
    identity already known, so the caller can still answer."""
    if len(frames) < 2:
        raise ProtocolError("bad_frames", f"expected [identity, header, payload], got {len(frames)} frame(s)")
    body = frames[1:]
    delimited = bool(body) and body[0] == b""
    if delimited:
        body = body[1:]
    if len(body) != 2:
        raise ProtocolError("bad_frames", f"expected [header, payload] after the envelope, got {len(body)} frame(s)")
    kind = parse_header(body[0], allowed)
    return frames[0], delimited, kind, body[1]


def decode_frames(frames: list[bytes], allowed) -> tuple[Kind, Any]:
    """DEALER frames [header, payload] -> (kind, message): what a worker, a client or a front reads
    from the scheduler. Anything else is a ProtocolError."""
    if len(frames) != 2:
        raise ProtocolError("bad_frames", f"expected [header, payload], got {len(frames)} frame(s)")
    kind = parse_header(frames[0], allowed)
    return kind, decode(kind, frames[1])


def reply_frames(identity: bytes, delimited: bool, kind: Kind, payload: msgspec.Struct) -> list[bytes]:
    return [identity] + ([b""] if delimited else []) + encode(kind, payload)


REQUEST_KINDS = frozenset({Kind.SUBMIT, Kind.PING})
CONTROL_KINDS = frozenset(
    {Kind.CANCEL, Kind.STATUS, Kind.STATS, Kind.DRAIN, Kind.SHUTDOWN, Kind.PING, Kind.COMPAT_REPORT, Kind.WORKER_LEAVE}
)
WORKER_KINDS = frozenset({Kind.REGISTER, Kind.HEARTBEAT, Kind.BATCH_RESULT, Kind.LEAVING, Kind.LEFT,
                          Kind.GIVE_BACK})
