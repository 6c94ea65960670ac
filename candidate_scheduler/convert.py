"""Between the wire (protocol.py's msgspec structs) and the core's types: one function each way.

The scheduler shell and the worker both use these, so every field is mapped in exactly one place.
A group's arrays are encoded for the wire once (`group_wire`, cached on the group), each candidate's
initial noise cut once, so a dispatch or a retry encodes nothing again.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import msgspec
import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.core import messages
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.values import value
from candidate_scheduler.core.work import BatchReport, CandidateWork, GroupOutput, GroupWork, SamplingSpec

# ---- sampling ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def sampling_to_wire(spec: SamplingSpec) -> protocol.SamplingMsg:
    # groups of one client share a few specs; both types are frozen, so one message serves them all
    return protocol.SamplingMsg(**spec.to_dict())


def sampling_from_wire(msg: protocol.SamplingMsg) -> SamplingSpec:
    return SamplingSpec(**msgspec.structs.asdict(msg))


# ---- client <-> scheduler --------------------------------------------------------------------------------


def submission_from_wire(req: protocol.SubmitRequest, scope: str | None = None) -> Submission:
    """Decode the arrays (ProtocolError for a bad one); nothing else is checked here. `scope`: whose request
    ids it names (core/request_scope.py)."""
    images = protocol.array_from_wire(req.images, max_bytes=protocol.MAX_OBSERVATION_BYTES)
    noise = None if req.initial_noise is None else protocol.array_from_wire(req.initial_noise)
    return Submission(
        request_id=req.request_id,
        images=images,
        prompt=req.prompt,
        candidates=msgspec.structs.asdict(req.candidates),
        seed=req.seed,
        sampling=msgspec.structs.asdict(req.sampling),
        batched=req.batched,
        deadline_s=req.deadline_s,
        initial_noise=noise,
        api=req.api,
        scope=scope,
    )


def _wire_array(arr) -> protocol.Array | None:
    return None if arr is None else protocol.array_to_wire(np.asarray(arr, dtype=np.float32))


def result_to_wire(r: messages.GroupResult, request_id: str | None = None) -> protocol.GroupResult:
    """`request_id`: the id its client sent, where the engine keys the group by a scoped one
    (core/request_scope.py); None: the result's own."""
    rollout = None
    if r.rollout is not None:
        fields = {k: _wire_array(v) for k, v in r.rollout.items() if k != "step_indices"}
        rollout = protocol.RolloutResult(**fields, step_indices=list(r.rollout["step_indices"]))
    return protocol.GroupResult(
        request_id=r.request_id if request_id is None else request_id,
        status=r.status,
        action=_wire_array(r.action),
        candidates=_wire_array(r.candidates),
        candidate_seeds=list(r.candidate_seeds),
        chosen_candidate=r.chosen_candidate,
        error=r.error,
        error_code=r.error_code,
        metrics=dict(r.metrics),
        rollout=rollout,
        served_count=r.served_count,
    )


# ---- scheduler -> worker ------------------------------------------------------------------------------------


@value
class GroupWire:
    images: protocol.Array  # [B, H, W, 3] uint8
    prompts: list[str]
    sampling: protocol.SamplingMsg
    initial_noise: dict[int, protocol.Array] | None  # candidate id -> [horizon, D]


def group_wire(group) -> GroupWire:
    """The group's wire form, made on first use and kept on the group."""
    if group.wire is None:
        req = group.request
        images = req.images
        group.wire = GroupWire(
            images=protocol.array_to_wire(images),
            prompts=list(req.prompts),
            sampling=sampling_to_wire(req.sampling),
            initial_noise=None if req.initial_noise is None else {
                c: protocol.array_to_wire(req.initial_noise[c]) for c in range(req.spec.count)},
        )
    return group.wire


def work_to_wire(send: messages.SendWork) -> tuple[protocol.Kind, protocol.BatchMsg]:
    groups = []
    for sw in send.slices:
        wire, d = group_wire(sw.group), sw.dispatch
        groups.append(protocol.GroupWorkMsg(
            request_id=d.request_id, images=wire.images, prompts=wire.prompts, sampling=wire.sampling,
            candidates=[protocol.CandidateMsg(cid, seed, snap, None if wire.initial_noise is None else wire.initial_noise[cid])
                        for cid, seed, snap in zip(d.candidate_ids, d.seeds, d.snapshots)],
        ))
    kind = protocol.Kind.JOIN if send.join else protocol.Kind.BATCH
    return kind, protocol.BatchMsg(send.batch_id, groups, send.rows)


def work_from_wire(g: protocol.GroupWorkMsg) -> GroupWork:
    """Worker side; raises ValueError / TypeError / ProtocolError for a group it cannot decode."""
    return GroupWork(
        request_id=g.request_id,
        images=protocol.array_from_wire(g.images),
        prompts=list(g.prompts),
        sampling=sampling_from_wire(g.sampling),
        candidates=[CandidateWork(c.candidate_id, c.seed, c.snapshot,
                                  None if c.initial_noise is None else protocol.array_from_wire(c.initial_noise))
                    for c in g.candidates],
    )


# ---- worker -> scheduler ------------------------------------------------------------------------------------


def _wire_dict(arrays: dict | None) -> dict | None:
    # floats go as float32, as the actions do: the scheduler serves float32 only (_served_as_is)
    return None if arrays is None else {k: protocol.array_to_wire(_float32(np.ascontiguousarray(v)))
                                        for k, v in arrays.items()}


def _float32(arr: np.ndarray) -> np.ndarray:
    return arr.astype(np.float32) if arr.dtype.kind == "f" and arr.dtype != np.float32 else arr


def output_to_wire(o: GroupOutput) -> protocol.GroupOutputMsg:
    return protocol.GroupOutputMsg(
        request_id=o.request_id,
        status=o.status,
        candidate_ids=list(o.candidate_ids),
        actions=None if o.actions is None else protocol.array_to_wire(np.asarray(o.actions, dtype=np.float32)),
        error=o.error,
        error_code=o.error_code,
        rollout=_wire_dict(o.rollout),
        rollout_meta=_wire_dict(o.rollout_meta),
    )


def report_to_wire(report: BatchReport, **extra) -> dict:
    return {**dataclasses.asdict(report), **extra}


_MAX_STEP_INDEX = 2**31  # far past any step count (core/work.py allows 1000); the group checks the exact one


def _served_as_is(actions, rollout: dict | None, meta: dict | None) -> str | None:
    """Why arrays that decoded cannot be served as sent, or None. A reply carries float32 (a float64
    beyond its range became inf, served "done") and rollout step indices are ints (a NaN, or a float past
    2**64, failed the reply as the scheduler's internal_error, not as the worker's fault)."""
    floats = [("actions", actions)] + [(f"rollout {k}", v) for k, v in (rollout or {}).items()] \
        + [(f"rollout_meta {k}", v) for k, v in (meta or {}).items() if k != "step_indices"]
    for name, arr in floats:
        if arr is not None and arr.dtype != np.float32:
            return f"{name} must be float32, got {arr.dtype}"
    idx = (meta or {}).get("step_indices")
    if idx is not None and (idx.dtype.kind not in "iu" or idx.ndim != 1
                            or (idx.size and not 0 <= int(idx.min()) <= int(idx.max()) < _MAX_STEP_INDEX)):
        return f"rollout_meta step_indices must be step indices (ints in [0, {_MAX_STEP_INDEX})), got {idx.dtype}{list(idx.shape)}"
    return None


def _outcome(o: protocol.GroupOutputMsg) -> messages.SliceOutcome:
    try:
        actions = None if o.actions is None else protocol.array_from_wire(o.actions)
        rollout = None if o.rollout is None else {k: protocol.array_from_wire(v) for k, v in o.rollout.items()}
        meta = None if o.rollout_meta is None else {k: protocol.array_from_wire(v) for k, v in o.rollout_meta.items()}
    except ValueError as exc:  # ProtocolError, or a shape whose product overflows
        return messages.SliceOutcome(o.request_id, o.status, tuple(o.candidate_ids), malformed=str(exc))
    why = _served_as_is(actions, rollout, meta)
    if why is not None:
        return messages.SliceOutcome(o.request_id, o.status, tuple(o.candidate_ids), malformed=why)
    return messages.SliceOutcome(o.request_id, o.status, tuple(int(c) for c in o.candidate_ids), actions, o.error,
                                 o.error_code, rollout, meta)


def worker_result_from_wire(msg: protocol.BatchResultMsg) -> messages.WorkerResult:
    return messages.WorkerResult(msg.worker_id, msg.batch_id, tuple(_outcome(o) for o in msg.outputs),
                                 _report(msg.report))


_REPORT_MAX = 2.0**53  # no count or time a worker measures; a reply could not carry the int of one beyond 2**64


def _report(report: dict | None) -> dict[str, float]:
    # A report is counts and seconds; the engine does arithmetic on it, so anything else (a string, inf,
    # a negative time from a broken worker, a count no worker reaches) is dropped here rather than
    # raising mid-result or in the reply it ends up in.
    return {k: v for k, v in (report or {}).items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and 0 <= v <= _REPORT_MAX}


def registration_from_wire(msg: protocol.RegisterMsg) -> messages.Registration:
    profile = tuple((str(label), int(rows), float(s)) for label, rows, s in msg.profile[:64])
    return messages.Registration(msg.worker_id, dict(msg.capability), msg.capacity, msg.device, msg.pid,
                                 msg.memory_budget_bytes, msg.conditioning, profile)


def heartbeat_from_wire(msg: protocol.HeartbeatMsg) -> messages.Heartbeat:
    running = tuple(msg.running) or (() if msg.busy_batch is None else (msg.busy_batch,))
    forwards = tuple((int(r), float(s), str(label)) for r, s, label in msg.forwards[:1024])
    cache = {str(k): max(0, int(v)) for k, v in list(msg.cache.items())[:16]}
    return messages.Heartbeat(msg.worker_id, running, msg.step, forwards, cache)
