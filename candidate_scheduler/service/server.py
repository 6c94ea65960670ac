"""The scheduler process: an asyncio ZMQ front over the pure rooms.

Three ROUTER sockets, one event loop, one owner of all state (no locks):

- request socket: SUBMIT (a candidate group) and PING. Each SUBMIT gets exactly one RESULT, or one
  ERROR when the message could not be read at all.
- control socket: CANCEL, STATUS, STATS, DRAIN, SHUTDOWN (and PING).
- worker link: workers REGISTER their capability and capacity, HEARTBEAT, and return BATCH_RESULTs;
  the scheduler sends BATCH and CANCEL_ROWS.

Every event ends with `_schedule()`, which plans one physical batch per idle worker from the FCFS
queue (microbatch.plan_batches). Group bookkeeping lives in GroupState (group_state.py), which makes
"answered exactly once" and "never a partial aggregate" structural; this module only moves messages.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from candidate_scheduler.core.admission import AdmissionPolicy, decide
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.group_state import GroupReply, GroupState, GroupStatus
from candidate_scheduler.core.microbatch import PhysicalBatch, QueuedGroup, plan_batches
from candidate_scheduler.core.spec import CandidateTrajectorySpec, ModelCapability
from candidate_scheduler.core.work import SamplingSpec

log = logging.getLogger("candidate_scheduler.service.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_REQUEST_PORT = 5555
DEFAULT_CONTROL_PORT = 5556
DEFAULT_WORKER_PORT = 5557
DEFAULT_COMPAT_PORT = 5558


@dataclass
class SchedulerConfig:
    request_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_REQUEST_PORT}"
    control_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_CONTROL_PORT}"
    worker_endpoint: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_WORKER_PORT}"
    metrics_host: str = DEFAULT_HOST
    metrics_port: int | None = 9464  # None: no HTTP exporter
    policy: AdmissionPolicy = AdmissionPolicy.MICROBATCH
    max_queued_groups: int = 1024
    retry_limit: int = 3  # attempts per slice, the first one included
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 3.0
    tick_s: float = 0.05
    finished_memory: int = 10_000  # finished groups remembered for STATUS
    curve_dir: str | None = None  # holds server.key_secret and authorized_clients/*.key


@dataclass
class _Group:
    state: GroupState
    identity: bytes
    delimited: bool
    request: protocol.SubmitRequest
    images: np.ndarray  # [B, H, W, 3] uint8
    prompts: list[str]
    sampling: SamplingSpec
    batched: bool
    received_at: float
    forwards: int = 0
    physical_batches: int = 0
    co_batched: int = 0  # physical batches shared with other groups
    initial_noise: np.ndarray | None = None  # rollout: caller-provided x_T, [count, H, D]
    rollout_parts: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # candidate id -> arrays
    rollout_meta: dict[str, np.ndarray] | None = None
    condition_s: float = 0.0
    denoise_s: float = 0.0
    postprocess_s: float = 0.0


@dataclass
class _Worker:
    worker_id: str
    identity: bytes
    capability: ModelCapability
    capacity: int
    device: str
    last_seen: float
    batch_id: int | None = None
    step: int | None = None


@dataclass
class _Batch:
    batch_id: int
    worker_id: str
    plan: PhysicalBatch
    sent_at: float
    cancelled: set[str] = field(default_factory=set)
    busy_seen_at: float | None = None  # last heartbeat in which the worker reported itself busy


class ServiceMetricsShim:
    """Calls into metrics.SchedulerMetrics when it is there; a no-op otherwise (tests without it)."""

    def __init__(self, metrics: Any | None):
        self._m = metrics

    def __getattr__(self, name: str):
        target = getattr(self._m, name, None) if self._m is not None else None
        if target is None or not callable(target):
            return lambda *a, **k: None
        return target


class Scheduler:
    def __init__(self, config: SchedulerConfig, metrics: Any | None = None, ctx: zmq.asyncio.Context | None = None):
        self.config = config
        self.metrics = ServiceMetricsShim(metrics)
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.groups: dict[str, _Group] = {}
        self.queue: collections.OrderedDict[str, None] = collections.OrderedDict()  # admitted, not finished
        self.waiting: collections.OrderedDict[str, None] = collections.OrderedDict()  # no worker yet
        self.finished: collections.OrderedDict[str, str] = collections.OrderedDict()  # id -> final status
        self.workers: dict[str, _Worker] = {}
        self.batches: dict[int, _Batch] = {}
        # Batch ids must not repeat across scheduler restarts: a worker still finishing a batch of the
        # previous incarnation would otherwise have its stale result taken for a new batch of the same id.
        self._next_batch = int.from_bytes(os.urandom(6), "big") + 1
        self.draining = False
        self.stopping = asyncio.Event()
        self.bound: dict[str, str] = {}
        self.counters = collections.Counter()
        self._authenticator = None

    # ---- sockets ----------------------------------------------------------------------------------
    def bind(self) -> dict[str, str]:
        def router(endpoint: str, name: str) -> zmq.asyncio.Socket:
            sock = self.ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
            if name == "worker":
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting worker takes its identity back
                self._secure_worker_link(sock, endpoint)
            self.bound[name] = _bind(sock, endpoint)
            return sock

        self.request_sock = router(self.config.request_endpoint, "request")
        self.control_sock = router(self.config.control_endpoint, "control")
        self.worker_sock = router(self.config.worker_endpoint, "worker")
        return dict(self.bound)

    def _secure_worker_link(self, sock, endpoint: str) -> None:
        if self.config.curve_dir is None:
            if not is_loopback_endpoint(endpoint):
                raise RuntimeError(
                    f"refusing to bind the worker link on non-loopback {endpoint} without CURVE keys: "
                    "pass --curve-dir (see `candidate-scheduler keys`)"
                )
            return
        from zmq.auth import load_certificate
        from zmq.auth.asyncio import AsyncioAuthenticator

        keys = os.path.join(self.config.curve_dir, "server.key_secret")
        public, secret = load_certificate(keys)
        auth = AsyncioAuthenticator(self.ctx)
        auth.start()
        auth.configure_curve(domain="*", location=os.path.join(self.config.curve_dir, "authorized_clients"))
        self._authenticator = auth
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def close(self) -> None:
        # The client-facing sockets linger, and the context is terminated (waiting <= 2 s), so the last
        # replies -- the shutdown answers -- leave before the process exits: LINGER 0 would discard what is
        # still queued, and pyzmq does not terminate contexts at interpreter exit.
        for name in ("request_sock", "control_sock", "worker_sock"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(linger=0 if name == "worker_sock" else 2000)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._owns_ctx:
            self.ctx.destroy(linger=2000)

    # ---- main loop ---------------------------------------------------------------------------------
    async def serve(self) -> None:
        tasks = [
            asyncio.create_task(self._pump(self.request_sock, self._on_request), name="requests"),
            asyncio.create_task(self._pump(self.control_sock, self._on_control), name="control"),
            asyncio.create_task(self._pump(self.worker_sock, self._on_worker), name="workers"),
            asyncio.create_task(self._ticker(), name="ticker"),
        ]
        try:
            await self.stopping.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Messages already queued in the sockets but never read still get their one answer: new
            # groups are refused ("rejected: draining"), control messages answered; then in-flight groups.
            self.draining = True
            for sock, handler in ((self.request_sock, self._on_request), (self.control_sock, self._on_control)):
                await self._drain_socket(sock, handler)
            await self._shutdown_replies()
            self.close()

    async def _drain_socket(self, sock, handler) -> None:
        while True:
            try:
                frames = await sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                await handler(frames)
            except Exception:  # noqa: BLE001 - shutting down; answer what can be answered
                log.exception("handler failed while draining at shutdown")

    async def _pump(self, sock, handler) -> None:
        while True:
            frames = await sock.recv_multipart(copy=True)
            try:
                await handler(frames)
            except Exception:  # noqa: BLE001 - the loop must outlive any one message
                log.exception("handler failed; the service keeps serving")
                self.counters["handler_errors"] += 1

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            now = time.monotonic()
            for gid in list(self.groups):
                g = self.groups.get(gid)
                if g is not None and g.state.deadline is not None and g.state.expire(now):
                    await self._end_group(g, hit="expired")
            for w in list(self.workers.values()):
                if now - w.last_seen > self.config.heartbeat_timeout_s:
                    await self._worker_lost(w, "heartbeat_timeout")
            self._publish_gauges()
            await self._schedule()

    # ---- request socket -------------------------------------------------------------------------------
    async def _on_request(self, frames: list[bytes]) -> None:
        try:
            identity, delimited, kind, msg = _read(frames, protocol.REQUEST_KINDS)
        except protocol.ProtocolError as exc:
            self.metrics.protocol_error("request", exc.kind)
            await self._answer_error(self.request_sock, frames, exc)
            return
        if kind is protocol.Kind.PING:
            await self.request_sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG, protocol.Pong(msg.nonce)))
            return
        await self._submit(identity, delimited, msg)

    async def _answer_error(self, sock, frames: list[bytes], exc: protocol.ProtocolError) -> None:
        if not frames or len(frames[0]) == 0 or len(frames[0]) > 256:
            return  # no usable identity: nobody to answer
        delimited = len(frames) > 1 and frames[1] == b""
        reply = protocol.ErrorReply(error=str(exc)[:2000], error_code=exc.kind)
        await sock.send_multipart(protocol.reply_frames(frames[0], delimited, protocol.Kind.ERROR, reply))

    async def _submit(self, identity: bytes, delimited: bool, req: protocol.SubmitRequest) -> None:
        now = time.monotonic()
        self.metrics.group_received()
        rid = req.request_id

        async def refuse(status: str, code: str, message: str, field_name: str | None = None) -> None:
            self.metrics.group_completed(status, 0.0)
            result = protocol.GroupResult(
                request_id=rid if isinstance(rid, str) else "", status=status, error=message, error_code=code,
                metrics={"error_field": field_name} if field_name else {},
            )
            await self.request_sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.RESULT, result))

        if not rid or len(rid) > protocol.MAX_REQUEST_ID_LEN:
            await refuse("invalid", "invalid_value", f"request_id must be 1..{protocol.MAX_REQUEST_ID_LEN} characters", "request_id")
            return
        if rid in self.groups:
            await refuse("invalid", "duplicate_request_id", f"request {rid!r} is already in flight", "request_id")
            return
        if self.draining:
            await refuse("rejected", "draining", "the scheduler is draining and admits no new groups")
            return
        if len(self.groups) >= self.config.max_queued_groups:
            await refuse("overloaded", "overloaded", f"{len(self.groups)} groups in flight; try again later")
            return
        try:
            spec = CandidateTrajectorySpec(
                count=req.candidates.count,
                reducer=req.candidates.reducer,
                return_candidates=req.candidates.return_candidates,
                seed_policy=req.candidates.seed_policy,
                seeds=tuple(req.candidates.seeds) if req.candidates.seeds is not None else None,
            )
            if spec.count > protocol.MAX_CANDIDATES:
                raise CandidateContractError("count", "count_over_limit", f"at most {protocol.MAX_CANDIDATES}", spec.count)
            sampling = SamplingSpec(**{k: getattr(req.sampling, k) for k in req.sampling.__struct_fields__})
            images = _observations(req)
            prompts = _prompts(req.prompt, images.shape[0])
            initial_noise = _initial_noise(req, spec, sampling)
            if sampling.rollout and spec.reducer != "none":
                raise CandidateContractError(
                    "reducer", "invalid_value", "a rollout returns every candidate; set reducer 'none'", spec.reducer
                )
            state = GroupState.from_request(
                rid, spec, req.seed,
                deadline=None if req.deadline_s is None else now + max(0.0, float(req.deadline_s)),
            )
        except CandidateContractError as exc:
            await refuse("invalid", exc.code, str(exc), exc.field)
            return
        except (ValueError, TypeError, protocol.ProtocolError) as exc:
            await refuse("invalid", getattr(exc, "kind", "bad_request"), str(exc))
            return
        group = _Group(state, identity, delimited, req, images, prompts, sampling, req.batched, now,
                       initial_noise=initial_noise)
        self.groups[rid] = group
        self.metrics.candidates_per_group(spec.count)
        if self._capability() is None:
            self.waiting[rid] = None  # admitted as soon as a worker registers
        else:
            await self._admit(group)
        await self._schedule()

    def _capability(self) -> tuple[ModelCapability, int] | None:
        live = list(self.workers.values())
        if not live:
            return None
        # Slices sized for the smallest live worker run anywhere; a larger worker co-batches them.
        return live[0].capability, min(w.capacity for w in live)

    async def _admit(self, group: _Group) -> None:
        capability, capacity = self._capability()
        decision = decide(
            group.state.spec, capability, action_mode=group.sampling.action_mode,
            policy=self.config.policy, batch_capacity=capacity,
        )
        admitted = group.state.admit(decision)
        self.metrics.admission(decision.mode.value, decision.reason)
        if admitted:
            self.queue[group.state.request_id] = None
            self.metrics.microbatches_per_group(len(decision.slices))
        else:
            await self._end_group(group, hit="rejected")

    # ---- scheduling -----------------------------------------------------------------------------------
    async def _schedule(self) -> None:
        idle = [w for w in self.workers.values() if w.batch_id is None]
        if not self.queue or not idle:
            return  # the common case under load: every worker busy, nothing to plan
        for worker in sorted(idle, key=lambda w: -w.capacity):
            queued = []
            for rid in self.queue:
                g = self.groups[rid]
                pending = tuple(p for p in g.state.pending_slices() if len(p[1]) <= worker.capacity)
                if pending:
                    queued.append(QueuedGroup(rid, g.sampling.batch_key(), pending))
            if not queued:
                return
            plan = plan_batches(queued, worker.capacity, max_batches=1)
            if plan:
                await self._dispatch(worker, plan[0])

    async def _dispatch(self, worker: _Worker, plan: PhysicalBatch) -> None:
        batch_id = self._next_batch
        self._next_batch += 1
        groups_msg = []
        shared = len({e.request_id for e in plan.entries}) > 1
        for entry in plan.entries:
            g = self.groups[entry.request_id]
            d = g.state.start_slice(entry.slice_index, worker.worker_id)
            if g.physical_batches == 0:
                self.metrics.queue_wait(time.monotonic() - g.received_at)
            g.physical_batches += 1
            g.co_batched += int(shared)
            groups_msg.append(
                protocol.GroupWorkMsg(
                    request_id=entry.request_id,
                    images=protocol.array_to_wire(g.images),
                    prompts=g.prompts,
                    sampling=protocol.SamplingMsg(**g.sampling.to_dict()),
                    candidates=[
                        protocol.CandidateMsg(
                            cid, seed, snap,
                            None if g.initial_noise is None else protocol.array_to_wire(g.initial_noise[cid]),
                        )
                        for cid, seed, snap in zip(d.candidate_ids, d.seeds, d.snapshots)
                    ],
                )
            )
        worker.batch_id = batch_id
        self.batches[batch_id] = _Batch(batch_id, worker.worker_id, plan, time.monotonic())
        self.metrics.physical_batch(plan.size, worker.capacity)
        await self.worker_sock.send_multipart([worker.identity, *protocol.encode(protocol.Kind.BATCH, protocol.BatchMsg(batch_id, groups_msg))])

    # ---- worker link ------------------------------------------------------------------------------------
    async def _on_worker(self, frames: list[bytes]) -> None:
        try:
            identity, _delimited, kind, msg = _read(frames, protocol.WORKER_KINDS)
        except protocol.ProtocolError as exc:
            self.metrics.protocol_error("worker", exc.kind)
            return  # a worker that speaks garbage gets no answer; its heartbeats lapse if it is broken
        now = time.monotonic()
        if kind is protocol.Kind.REGISTER:
            await self._register(identity, msg, now)
            return
        worker = self.workers.get(msg.worker_id)
        if worker is None or worker.identity != identity:
            # Unknown (e.g. the scheduler restarted, or we declared it dead): ask it to register again.
            stop = protocol.WorkerStopMsg(reason="reregister")
            await self.worker_sock.send_multipart([identity, *protocol.encode(protocol.Kind.WORKER_STOP, stop)])
            if kind is protocol.Kind.BATCH_RESULT:
                self.counters["late_results_discarded"] += 1
                self.metrics.late_result()
            return
        worker.last_seen = now
        if kind is protocol.Kind.HEARTBEAT:
            worker.step = msg.step
            self.metrics.heartbeat()
            await self._check_batch_alive(worker, msg.busy_batch, now)
            return
        await self._batch_result(worker, msg)

    async def _check_batch_alive(self, worker: _Worker, busy_batch: int | None, now: float) -> None:
        """A live worker that reports itself idle for longer than the heartbeat timeout while we think it
        holds a batch has lost that batch or its result on the link (a message over MAXMSGSIZE is dropped
        with the connection, which the worker then re-opens): retry its slices instead of waiting forever.
        A worker reports a batch as busy from the moment it takes it until its result is sent."""
        batch = self.batches.get(worker.batch_id) if worker.batch_id is not None else None
        if batch is None:
            return
        if busy_batch is not None:
            batch.busy_seen_at = now
            return
        if now - (batch.busy_seen_at or batch.sent_at) <= self.config.heartbeat_timeout_s:
            return
        log.warning("worker %s is idle but batch %d never came back; retrying its slices", worker.worker_id, batch.batch_id)
        self.batches.pop(batch.batch_id, None)
        worker.batch_id = None
        self.counters["batches_lost"] += 1
        self.metrics.worker_failure("worker_error")
        for entry in batch.plan.entries:
            await self._slice_failed(entry, worker, "worker_error", "batch lost: the worker is idle, its result never arrived")
        await self._schedule()

    async def _register(self, identity: bytes, msg: protocol.RegisterMsg, now: float) -> None:
        try:
            capability = ModelCapability.from_dict(msg.capability)
            if msg.capacity < 1:
                raise ValueError("capacity must be >= 1")
        except (CandidateContractError, ValueError, TypeError) as exc:
            self.metrics.protocol_error("worker", "bad_type")
            stop = protocol.WorkerStopMsg(reason=f"bad registration: {exc}")
            await self.worker_sock.send_multipart([identity, *protocol.encode(protocol.Kind.WORKER_STOP, stop)])
            return
        old = self.workers.get(msg.worker_id)
        if old is not None:
            await self._worker_lost(old, "reregistered")
        self.workers[msg.worker_id] = _Worker(
            msg.worker_id, identity, capability, min(msg.capacity, capability.max_candidates_per_batch), msg.device, now
        )
        log.info("worker %s registered (capacity %d, %s)", msg.worker_id, msg.capacity, msg.device)
        reply = protocol.RegisteredMsg(msg.worker_id, self.config.heartbeat_interval_s)
        await self.worker_sock.send_multipart([identity, *protocol.encode(protocol.Kind.REGISTERED, reply)])
        for rid in list(self.waiting):
            self.waiting.pop(rid)
            g = self.groups.get(rid)
            if g is not None and g.state.status is GroupStatus.QUEUED:
                await self._admit(g)
        await self._schedule()

    async def _worker_lost(self, worker: _Worker, reason: str) -> None:
        """The worker is gone (or presumed so): its running slices go back to pending, to be retried
        from their snapshots; a result it sends later is discarded."""
        self.workers.pop(worker.worker_id, None)
        self.metrics.worker_failure(reason)
        log.warning("worker %s lost (%s)", worker.worker_id, reason)
        batch = self.batches.pop(worker.batch_id, None) if worker.batch_id is not None else None
        if batch is None:
            return
        for entry in batch.plan.entries:
            g = self.groups.get(entry.request_id)
            if g is None:
                continue
            if g.state.fail_slice(entry.slice_index, reason, self.config.retry_limit, worker_id=worker.worker_id):
                self.metrics.retry(reason)
                if g.state.finished:
                    await self._end_group(g, hit="failed")
        await self._schedule()

    async def _batch_result(self, worker: _Worker, msg: protocol.BatchResultMsg) -> None:
        batch = self.batches.get(msg.batch_id)
        if batch is None or batch.worker_id != worker.worker_id:
            self.counters["late_results_discarded"] += 1
            self.metrics.late_result()
            return
        self.batches.pop(msg.batch_id)
        worker.batch_id = None
        report = msg.report or {}
        self.metrics.worker_report(report)
        entries = batch.plan.entries
        if len(msg.outputs) != len(entries):
            # A wrong-shaped answer is the worker's fault: retry every member elsewhere.
            for entry in entries:
                await self._slice_failed(entry, worker, "worker_error", "batch result has the wrong number of outputs")
            await self._schedule()
            return
        share = 1.0 / max(1, len(entries))
        for entry, out in zip(entries, msg.outputs):
            g = self.groups.get(entry.request_id)
            if g is None or g.state.finished:
                continue
            g.forwards += int(report.get("transformer_forwards", 0))
            for name in ("condition_s", "denoise_s", "postprocess_s"):
                setattr(g, name, getattr(g, name) + share * float(report.get(name, 0.0)))
            if out.request_id != entry.request_id:
                await self._slice_failed(entry, worker, "worker_error", "batch result answers another request")
                continue
            if out.status == "ok":
                try:
                    actions = protocol.array_from_wire(out.actions) if out.actions is not None else None
                    # [n, B, horizon, raw_action_dim] exactly: the partial reducer takes its shape from the
                    # first slice folded, so a wrong-shaped first slice would be served as "done"
                    want = (g.images.shape[0], g.sampling.horizon, g.sampling.raw_action_dim)
                    if actions is None or actions.ndim != 4 or tuple(actions.shape[1:]) != want:
                        raise CandidateContractError("actions", "shape_mismatch", f"expected [n, {', '.join(map(str, want))}]",
                                                     None if actions is None else list(actions.shape))
                    parts = _rollout_parts(g, out, len(out.candidate_ids))
                    if g.state.complete_slice(entry.slice_index, worker.worker_id, out.candidate_ids, actions):
                        for k, cid in enumerate(out.candidate_ids):
                            if parts is not None:
                                g.rollout_parts[int(cid)] = {name: arr[k] for name, arr in parts.items()}
                        if out.rollout_meta is not None and g.rollout_meta is None:
                            g.rollout_meta = {k: protocol.array_from_wire(v) for k, v in out.rollout_meta.items()}
                except (ValueError, protocol.ProtocolError) as exc:  # ValueError: CandidateContractError, or an
                    # Array whose shape product overflows in array_from_wire (escaping here strands the batch)
                    await self._slice_failed(entry, worker, "worker_error", f"malformed result: {exc}")
                    continue
                if g.state.status is GroupStatus.REDUCING:
                    g.state.finish()
                    self.metrics.reducer_time(g.state.reducer_s or 0.0)
                    await self._end_group(g)
            elif out.status == "error" and out.error_code not in (None, "model_error"):
                # The request itself is bad (observations, prompts): no retry can fix it.
                g.state.fail(out.error_code, out.error or "bad request")
                await self._end_group(g, hit="failed")
            elif out.status == "cancelled":
                continue  # we asked for it; the group already answered
            else:
                await self._slice_failed(entry, worker, "worker_error", out.error or "worker error")
        await self._schedule()

    async def _slice_failed(self, entry, worker: _Worker, reason: str, detail: str) -> None:
        g = self.groups.get(entry.request_id)
        if g is None:
            return
        if g.state.fail_slice(entry.slice_index, f"{reason}: {detail}", self.config.retry_limit, worker_id=worker.worker_id):
            self.metrics.retry(reason)
            if g.state.finished:
                await self._end_group(g, hit="failed")

    # ---- endings ------------------------------------------------------------------------------------------
    async def _end_group(self, g: _Group, hit: str | None = None) -> None:
        """Send the group's one reply and forget it. Running slices are told to stop."""
        rid = g.state.request_id
        for slice_idx, worker_id in g.state.running_slices().items():
            worker = self.workers.get(worker_id)
            if worker is not None and worker.batch_id is not None:
                batch = self.batches.get(worker.batch_id)
                if batch is not None and rid not in batch.cancelled:
                    batch.cancelled.add(rid)
                    msg = protocol.CancelRowsMsg(batch.batch_id, [rid])
                    await self.worker_sock.send_multipart([worker.identity, *protocol.encode(protocol.Kind.CANCEL_ROWS, msg)])
        reply = g.state.take_reply()
        self.groups.pop(rid, None)
        self.queue.pop(rid, None)
        self.waiting.pop(rid, None)
        self.finished[rid] = g.state.status.name.lower()
        while len(self.finished) > self.config.finished_memory:
            self.finished.popitem(last=False)
        if reply is None:
            return
        result = self._result(g, reply)
        self.metrics.group_completed(result.status, time.monotonic() - g.received_at)
        await self.request_sock.send_multipart(protocol.reply_frames(g.identity, g.delimited, protocol.Kind.RESULT, result))

    def _result(self, g: _Group, reply: GroupReply) -> protocol.GroupResult:
        def shaped(arr, candidate_axis: bool):
            if arr is None:
                return None
            arr = np.asarray(arr, dtype=np.float32)
            if not g.batched:  # one observation: drop the observation axis
                arr = arr[:, 0] if candidate_axis else arr[0]
            return protocol.array_to_wire(arr)

        metrics = dict(reply.metrics)
        metrics.update(
            physical_forwards=g.forwards,
            physical_batches=g.physical_batches,
            co_batched_batches=g.co_batched,
            condition_s=g.condition_s,
            denoise_s=g.denoise_s,
            postprocess_s=g.postprocess_s,
        )
        return protocol.GroupResult(
            rollout=self._rollout_result(g) if reply.status is GroupStatus.DONE else None,
            request_id=reply.request_id,
            status=_public_status(reply),
            action=shaped(reply.action, False),
            candidates=shaped(reply.candidates, True),
            candidate_seeds=list(reply.candidate_seeds),
            chosen_candidate=reply.chosen_candidate,
            error=reply.error_message,
            error_code=reply.error_code,
            metrics={k: v for k, v in metrics.items() if v is not None},
        )

    def _rollout_result(self, g: _Group) -> protocol.RolloutResult | None:
        if not g.sampling.rollout or not g.rollout_parts or g.rollout_meta is None:
            return None
        ids = range(g.state.spec.count)

        def stacked(name: str):
            arr = np.stack([g.rollout_parts[c][name] for c in ids]).astype(np.float32, copy=False)
            return protocol.array_to_wire(arr if g.batched else arr[:, 0])

        meta = g.rollout_meta
        return protocol.RolloutResult(
            log_probs=stacked("log_probs"),
            latents=stacked("latents"),
            next_latents=stacked("next_latents"),
            means=stacked("means"),
            stds=stacked("stds"),
            final_latents=stacked("final_latents"),
            sigmas=protocol.array_to_wire(meta["sigmas"].astype(np.float32, copy=False)),
            timesteps=protocol.array_to_wire(meta["timesteps"].astype(np.float32, copy=False)),
            step_indices=[int(i) for i in meta["step_indices"]],
        )

    async def _shutdown_replies(self) -> None:
        for g in list(self.groups.values()):
            if not g.state.finished:
                g.state.fail("shutting_down", "the scheduler is shutting down")
            await self._end_group(g, hit="failed")
        for w in list(self.workers.values()):
            try:
                msg = protocol.WorkerStopMsg(reason="reregister")  # the scheduler may come back on the same port
                await self.worker_sock.send_multipart([w.identity, *protocol.encode(protocol.Kind.WORKER_STOP, msg)])
            except zmq.ZMQError:
                pass

    # ---- control socket ------------------------------------------------------------------------------------
    async def _on_control(self, frames: list[bytes]) -> None:
        try:
            identity, delimited, kind, msg = _read(frames, protocol.CONTROL_KINDS)
        except protocol.ProtocolError as exc:
            self.metrics.protocol_error("control", exc.kind)
            await self._answer_error(self.control_sock, frames, exc)
            return
        if kind is protocol.Kind.PING:
            await self.control_sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG, protocol.Pong(msg.nonce)))
            return
        reply = await self._control(kind, msg)
        await self.control_sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY, reply))
        if kind is protocol.Kind.SHUTDOWN:
            self.stopping.set()

    async def _control(self, kind: protocol.Kind, msg) -> protocol.ControlReply:
        if kind is protocol.Kind.CANCEL:
            g = self.groups.get(msg.request_id)
            if g is None:
                state = self.finished.get(msg.request_id, "unknown")
                self.metrics.cancellation("done" if state != "unknown" else "unknown")
                return protocol.ControlReply(ok=True, changed=False, state=state)
            hit = g.state.status.name.lower()
            changed = g.state.cancel()
            if changed:
                self.metrics.cancellation(hit)
                await self._end_group(g, hit="cancelled")
                await self._schedule()
            return protocol.ControlReply(ok=True, changed=changed, state=hit)
        if kind is protocol.Kind.STATUS:
            g = self.groups.get(msg.request_id)
            if g is None:
                return protocol.ControlReply(ok=True, state=self.finished.get(msg.request_id, "unknown"))
            s = g.state
            return protocol.ControlReply(
                ok=True,
                state=s.status.name.lower(),
                detail={
                    "count": s.spec.count,
                    "slices": len(s.slices),
                    "pending_slices": len(s.pending_slices()),
                    "running_slices": len(s.running_slices()),
                    "candidates_done": len(s.partial.done()),
                },
            )
        if kind is protocol.Kind.STATS:
            return protocol.ControlReply(ok=True, detail=self.stats())
        if kind is protocol.Kind.COMPAT_REPORT:
            # bounded: each count is capped so a hostile report cannot spin the loop
            for name, n in msg.requests.items():
                for _ in range(max(0, min(int(n), 100_000))):
                    self.metrics.compat_request(name)
            for name, n in msg.errors.items():
                for _ in range(max(0, min(int(n), 100_000))):
                    self.metrics.protocol_error("compat", name)
            return protocol.ControlReply(ok=True)
        if kind is protocol.Kind.DRAIN:
            changed = not self.draining
            self.draining = True
            return protocol.ControlReply(ok=True, changed=changed, state="draining", detail={"in_flight": len(self.groups)})
        if kind is protocol.Kind.SHUTDOWN:
            return protocol.ControlReply(ok=True, changed=True, state="stopping", detail={"in_flight": len(self.groups)})
        return protocol.ControlReply(ok=False, error=f"unsupported control kind {kind.name}")

    def stats(self) -> dict:
        return {
            "groups_in_flight": len(self.groups),
            # queued = admitted or waiting for a worker, not yet started; running groups are not queued
            "queued_groups": len(self.waiting)
            + sum(1 for rid in self.queue if self.groups[rid].state.status is GroupStatus.ADMITTED),
            "queued_candidates": sum(len(c) for rid in self.queue for _i, c in self.groups[rid].state.pending_slices()),
            "workers": {
                w.worker_id: {"capacity": w.capacity, "device": w.device, "busy": w.batch_id is not None, "step": w.step}
                for w in self.workers.values()
            },
            "batches_in_flight": len(self.batches),
            "draining": self.draining,
            "late_results_discarded": self.counters["late_results_discarded"],
            "batches_lost": self.counters["batches_lost"],
            "handler_errors": self.counters["handler_errors"],
        }

    def _publish_gauges(self) -> None:
        st = self.stats()
        self.metrics.queue_depth(st["queued_groups"], st["queued_candidates"])
        self.metrics.live_workers(len(self.workers))


# Admission rejections end the group FAILED inside GroupState; the client sees them as "rejected".
_REJECT_CODES = frozenset({"unknown_reducer", "count_over_limit", "unsupported_action_mode", "does_not_fit"})


def _public_status(reply: GroupReply) -> str:
    if reply.status is GroupStatus.FAILED and reply.error_code in _REJECT_CODES:
        return "rejected"
    return reply.reason


def _read(frames: list[bytes], allowed) -> tuple[bytes, bool, protocol.Kind, Any]:
    """split_envelope + decode: every unreadable message is a ProtocolError."""
    identity, delimited, kind, payload = protocol.split_envelope(frames, allowed)
    return identity, delimited, kind, protocol.decode(kind, payload)


def _observations(req: protocol.SubmitRequest) -> np.ndarray:
    images = protocol.array_from_wire(req.images, max_bytes=protocol.MAX_OBSERVATION_BYTES)
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {images.dtype}")
    if req.batched:
        if images.ndim != 4:
            raise ValueError(f"batched images must be [B, H, W, 3], got shape {list(images.shape)}")
    else:
        if images.ndim != 3:
            raise ValueError(f"images must be [H, W, 3] (set batched for [B, H, W, 3]), got shape {list(images.shape)}")
        images = images[None]
    if images.shape[0] < 1 or images.shape[-1] != 3:
        raise ValueError(f"images must have 3 channels and at least one observation, got shape {list(images.shape)}")
    return images


ROLLOUT_PARTS = ("log_probs", "latents", "next_latents", "means", "stds", "final_latents")


def _rollout_parts(g: _Group, out: protocol.GroupOutputMsg, n: int) -> dict[str, np.ndarray] | None:
    """A slice's rollout arrays ([n, B, ...] each), checked before anything is folded."""
    if not g.sampling.rollout:
        return None
    if out.rollout is None or set(out.rollout) != set(ROLLOUT_PARTS) or out.rollout_meta is None:
        raise CandidateContractError("rollout", "shape_mismatch", f"a rollout slice must carry {ROLLOUT_PARTS}", None)
    parts = {k: protocol.array_from_wire(v) for k, v in out.rollout.items()}
    for name, arr in parts.items():
        if arr.ndim < 2 or arr.shape[0] != n or arr.shape[1] != g.images.shape[0]:
            raise CandidateContractError("rollout", "shape_mismatch", f"{name} must be [n, B, ...]", list(arr.shape))
    return parts


def _initial_noise(req: protocol.SubmitRequest, spec: CandidateTrajectorySpec, sampling: SamplingSpec) -> np.ndarray | None:
    if req.initial_noise is None:
        return None
    noise = protocol.array_from_wire(req.initial_noise)
    want = (spec.count, sampling.horizon)
    if noise.dtype not in (np.float32, np.float64) or noise.ndim != 3 or noise.shape[:2] != want:
        raise ValueError(f"initial_noise must be float [count={want[0]}, horizon={want[1]}, D], got "
                         f"{noise.dtype}{list(noise.shape)}")
    if noise.shape[2] < sampling.raw_action_dim:
        raise ValueError(f"initial_noise has {noise.shape[2]} action dims, raw_action_dim is {sampling.raw_action_dim}")
    if not np.all(np.isfinite(noise)):
        raise ValueError("initial_noise must be finite")
    return noise.astype(np.float32)


def _prompts(prompt, n: int) -> list[str]:
    if isinstance(prompt, str):
        prompts = [prompt] * n
    else:
        prompts = list(prompt)
        if len(prompts) == 1:
            prompts = prompts * n
    if len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompt(s) for {n} observation(s)")
    for p in prompts:
        if len(p) > protocol.MAX_PROMPT_CHARS:
            raise ValueError(f"prompt longer than {protocol.MAX_PROMPT_CHARS} characters")
    return prompts


def _bind(sock, endpoint: str) -> str:
    """Bind; port 0 (tcp://host:0) picks a free port. Returns the endpoint actually bound."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        host = endpoint[len("tcp://"):-2]
        port = sock.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def is_loopback_endpoint(endpoint: str) -> bool:
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    parsed = urllib.parse.urlparse(endpoint)
    host = parsed.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run_scheduler(config: SchedulerConfig, metrics: Any | None = None, on_bound=None) -> None:
    scheduler = Scheduler(config, metrics)
    bound = scheduler.bind()
    if on_bound is not None:
        on_bound(scheduler, bound)
    await scheduler.serve()
