"""What goes into the engine and what comes out of it: plain frozen dataclasses, no wire format.

The shell (service/server.py) decodes a socket message into one of the inputs, calls the engine, and
sends each output it gets back; `convert.py` maps both to and from protocol.py's wire structs. A client
or a worker is known to the engine only by an opaque reference the shell hands it (`client`,
`identity`), so the engine never learns what a socket is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

import numpy as np

from candidate_scheduler.core.group_state import SliceDispatch
from candidate_scheduler.core.values import value

# ---- inputs from workers ------------------------------------------------------------------------


@value
class Registration:
    worker_id: str
    capability: Mapping[str, Any]  # ModelCapability.to_dict()
    capacity: int  # candidate rows the worker holds at once
    device: str = "cpu"
    pid: int = 0
    memory_budget_bytes: int = 0
    conditioning: str = "inline"  # "thread": joiners are conditioned beside the running batch's steps
    # the warm-up profile: (forward label, rows, seconds) of forwards the worker timed before registering
    profile: tuple[tuple[str, int, float], ...] = ()


@value
class Heartbeat:
    worker_id: str
    running: tuple[int, ...] = ()  # assignment ids the worker holds (queued or in its running batch)
    step: int | None = None
    # (rows, seconds, forward label) of the transformer forwards since the last heartbeat
    forwards: tuple[tuple[int, float, str], ...] = ()
    # the worker's conditioning cache: hit / miss / eviction increments since the last heartbeat, bytes in use
    cache: Mapping[str, int] = field(default_factory=dict)


@value
class Leaving:
    """The worker is going (its process got SIGTERM): it takes no new work and finishes what it holds
    within `grace_s`, then says `Left`."""

    worker_id: str
    grace_s: float


@value
class Left:
    """The worker's last message: it is gone now (`reason` is its own account, for the log)."""

    worker_id: str
    reason: str


@value
class GiveBack:
    """A leaving worker hands back assignments it holds and has not started (they waited for its rows):
    run elsewhere now, they need not wait for what it runs before it goes."""

    worker_id: str
    batch_ids: tuple[int, ...]


@value
class SliceOutcome:
    """One group's answer inside a worker result; arrays already decoded. `malformed` says why the
    shell could not decode it (the worker's fault: retried)."""

    request_id: str
    status: str  # "ok" | "cancelled" | "error"
    candidate_ids: tuple[int, ...] = ()
    actions: np.ndarray | None = None
    error: str | None = None
    error_code: str | None = None
    rollout: Mapping[str, np.ndarray] | None = None
    rollout_meta: Mapping[str, np.ndarray] | None = None
    malformed: str | None = None


@value
class WorkerResult:
    worker_id: str
    batch_id: int
    outputs: tuple[SliceOutcome, ...]
    report: Mapping[str, Any] = field(default_factory=dict)


# ---- outputs ------------------------------------------------------------------------------------------


@value
class GroupResult:
    """A group's one reply in core terms (numpy arrays); convert.result_to_wire makes the wire struct."""

    request_id: str
    status: str  # done | failed | cancelled | expired | rejected | overloaded | invalid
    action: np.ndarray | None = None
    candidates: np.ndarray | None = None
    candidate_seeds: tuple[int, ...] = ()
    chosen_candidate: int | None = None
    error: str | None = None
    error_code: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    rollout: Mapping[str, Any] | None = None  # ROLLOUT_FIELDS and ROLLOUT_META_FIELDS -> arrays
    served_count: int | None = None


@value
class Reply:
    """Send `result` to the client that submitted the group."""

    client: Any
    result: GroupResult


@value
class SliceWork:
    """One slice of one group inside a worker assignment. `group` is the engine's Group: the shell
    reads its request and its cached wire form from it."""

    group: Any
    dispatch: SliceDispatch


@value
class SendWork:
    """Give a worker an assignment. `join` is true when the worker is already running others: the
    slices join its running batch at the next denoise-step boundary (step-level batching)."""

    identity: Any
    batch_id: int
    slices: tuple[SliceWork, ...]
    join: bool = False
    rows: int = 0  # the rows the worker may run at once, when fewer than it registered with; 0: its own


@value
class CancelRows:
    identity: Any
    batch_id: int
    request_ids: tuple[str, ...]


@value
class AckRegistration:
    identity: Any
    worker_id: str
    heartbeat_interval_s: float


@value
class AckLeaving:
    """To a leaving worker: nothing more will be sent; these assignments (sent, not yet answered) are
    what it should finish before it goes."""

    identity: Any
    batch_ids: tuple[int, ...]


# StopWorker reasons that do not stop the worker: register again (the scheduler forgot it), or leave as
# on SIGTERM (an operator asked; core/control.py). Any other reason stops it at once.
REREGISTER, LEAVE = "reregister", "leave"


@value
class StopWorker:
    """Tell a worker to stop (`reason`, for its log), to register again (REREGISTER), or to leave (LEAVE)."""

    identity: Any
    reason: str


@value
class InternalFault:
    """Code inside the engine raised while it handled `event`. The groups it was working on
    (`request_ids`) were answered `failed` with `internal_error`; the shell logs this with the
    traceback, and the metrics count it."""

    event: str
    error: str
    traceback: str
    request_ids: tuple[str, ...] = ()


@value
class ControlAnswer:
    ok: bool
    changed: bool = False
    state: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    error_code: str | None = None  # e.g. "forbidden" (core/access.py)
