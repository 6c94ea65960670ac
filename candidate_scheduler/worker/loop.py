"""The worker process: one DEALER to the scheduler's worker link, one model adapter.

Two threads, so heartbeats and cancels keep flowing while a batch runs:

- the I/O thread owns the ZMQ DEALER: it registers, sends heartbeats, receives BATCH (handed to the
  compute thread) and CANCEL_ROWS (recorded in a lock-guarded set the denoise loop polls at each step
  boundary), and forwards results that the compute thread pushes through an inproc PAIR (so a result
  leaves at once, not at the next poll tick);
- the compute thread runs `adapter.run_batch`, one batch at a time.

If the scheduler forgets us (restart, or it declared us dead), it answers WORKER_STOP("reregister")
and we register again; ZMQ reconnects the TCP link by itself.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from typing import Protocol

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.core.work import BatchReport, CandidateWork, GroupOutput, GroupWork, SamplingSpec

log = logging.getLogger("candidate_scheduler.worker")


class Adapter(Protocol):
    def capability_dict(self) -> dict: ...

    def run_batch(self, items, should_drop=None, on_step=None) -> tuple[list[GroupOutput], BatchReport]: ...


class Worker:
    def __init__(
        self,
        scheduler_endpoint: str,
        adapter: Adapter,
        *,
        capacity: int | None = None,
        device: str = "cpu",
        worker_id: str | None = None,
        curve_dir: str | None = None,
        register_timeout_s: float = 2.0,
        step_delay_s: float = 0.0,
    ):
        self.endpoint = scheduler_endpoint
        self.adapter = adapter
        capability = adapter.capability_dict()
        self.capacity = int(capacity or capability["max_candidates_per_batch"])
        self.device = device
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.curve_dir = curve_dir
        self.register_timeout_s = register_timeout_s
        # A test/benchmark knob: stretch each denoise step so a fault or a cancel can be placed at a
        # chosen step of a real model run. 0 in production.
        self.step_delay_s = step_delay_s
        self.heartbeat_interval_s = 0.5
        self.ctx = zmq.Context()
        self._inbox: queue.Queue = queue.Queue()
        self._cancel_lock = threading.Lock()
        self._cancelled: dict[int, set[str]] = {}
        self._current: tuple[int, int] | None = None  # (batch_id, step)
        self._stop = threading.Event()
        self.registered = threading.Event()
        self._wake_addr = f"inproc://worker-results-{id(self)}"

    # ---- compute side ------------------------------------------------------------------------------
    def _compute_loop(self) -> None:
        out = self.ctx.socket(zmq.PAIR)
        out.connect(self._wake_addr)
        try:
            while not self._stop.is_set():
                try:
                    batch = self._inbox.get(timeout=0.2)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                self._current = (batch.batch_id, None)  # busy from the moment it is taken: heartbeats say so
                try:
                    frames = protocol.encode(protocol.Kind.BATCH_RESULT, self._run(batch))
                except Exception as exc:  # noqa: BLE001 - if this thread died, the worker would heartbeat on
                    # and never answer again (e.g. an adapter returning fewer outputs than groups)
                    log.exception("batch %d could not be answered", batch.batch_id)
                    outputs = [protocol.GroupOutputMsg(g.request_id, "error", error=f"{type(exc).__name__}: {exc}",
                                                error_code="model_error") for g in batch.groups]
                    frames = protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(self.worker_id, batch.batch_id, outputs))
                finally:
                    self._current = None
                out.send_multipart(frames)
        finally:
            out.close(0)

    def _run(self, batch: protocol.BatchMsg) -> protocol.BatchResultMsg:
        items: list[GroupWork] = []
        decode_errors: dict[int, GroupOutput] = {}
        for i, g in enumerate(batch.groups):
            try:
                items.append(
                    GroupWork(
                        request_id=g.request_id,
                        images=protocol.array_from_wire(g.images),
                        prompts=list(g.prompts),
                        sampling=SamplingSpec(**{k: getattr(g.sampling, k) for k in g.sampling.__struct_fields__}),
                        candidates=[
                            CandidateWork(
                                c.candidate_id, c.seed, c.snapshot,
                                None if c.initial_noise is None else protocol.array_from_wire(c.initial_noise),
                            )
                            for c in g.candidates
                        ],
                    )
                )
            except (ValueError, TypeError, protocol.ProtocolError) as exc:
                decode_errors[i] = GroupOutput(g.request_id, "error", error=str(exc), error_code="bad_request")
                items.append(None)
        runnable = [it for it in items if it is not None]

        def should_drop():
            with self._cancel_lock:
                return set(self._cancelled.get(batch.batch_id, ()))

        def on_step(i: int) -> None:
            self._current = (batch.batch_id, i)
            if self.step_delay_s:
                time.sleep(self.step_delay_s)

        t0 = time.perf_counter()
        try:
            outputs, report = self.adapter.run_batch(runnable, should_drop=should_drop, on_step=on_step)
        except Exception as exc:  # noqa: BLE001 - an adapter crash fails the batch, the worker lives on
            log.exception("batch %d failed", batch.batch_id)
            outputs = [GroupOutput(it.request_id, "error", error=f"{type(exc).__name__}: {exc}", error_code="model_error")
                       for it in runnable]
            report = BatchReport()
        finally:
            self._current = None
            with self._cancel_lock:
                self._cancelled.pop(batch.batch_id, None)
        merged, it = [], iter(outputs)
        for i in range(len(items)):
            merged.append(decode_errors[i] if i in decode_errors else next(it))
        msgs = [
            protocol.GroupOutputMsg(
                request_id=o.request_id,
                status=o.status,
                candidate_ids=list(o.candidate_ids),
                actions=None if o.actions is None else protocol.array_to_wire(np.asarray(o.actions, dtype=np.float32)),
                error=o.error,
                error_code=o.error_code,
                rollout=_wire_dict(o.rollout),
                rollout_meta=_wire_dict(o.rollout_meta),
            )
            for o in merged
        ]
        rep = report.to_dict()
        rep["wall_s"] = time.perf_counter() - t0
        return protocol.BatchResultMsg(worker_id=self.worker_id, batch_id=batch.batch_id, outputs=msgs, report=rep)

    # ---- I/O side --------------------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, self.worker_id.encode())
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self.curve_dir is not None:
            from zmq.auth import load_certificate

            pub, sec = load_certificate(os.path.join(self.curve_dir, "client.key_secret"))
            server_pub, _ = load_certificate(os.path.join(self.curve_dir, "server.key"))
            sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = pub, sec, server_pub
        sock.connect(self.endpoint)
        return sock

    def _register_msg(self) -> list[bytes]:
        msg = protocol.RegisterMsg(
            worker_id=self.worker_id,
            capability=self.adapter.capability_dict(),
            capacity=self.capacity,
            device=self.device,
            pid=os.getpid(),
        )
        return protocol.encode(protocol.Kind.REGISTER, msg)

    def serve(self) -> None:
        """Run until WORKER_STOP (other than "reregister") or stop()."""
        wake = self.ctx.socket(zmq.PAIR)
        wake.bind(self._wake_addr)
        compute = threading.Thread(target=self._compute_loop, name="compute", daemon=True)
        compute.start()
        sock = self._socket()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        sock.send_multipart(self._register_msg())
        last_register = last_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(timeout=int(self.heartbeat_interval_s * 250)))
                now = time.monotonic()
                if wake in events:
                    sock.send_multipart(wake.recv_multipart())
                if sock in events:
                    if self._on_message(sock, sock.recv_multipart()):
                        return
                if not self.registered.is_set():
                    if now - last_register > self.register_timeout_s:
                        sock.send_multipart(self._register_msg())
                        last_register = now
                elif now - last_beat >= self.heartbeat_interval_s:
                    current = self._current
                    beat = protocol.HeartbeatMsg(self.worker_id, *(current if current else (None, None)))
                    sock.send_multipart(protocol.encode(protocol.Kind.HEARTBEAT, beat))
                    last_beat = now
        finally:
            self._stop.set()
            self._inbox.put(None)
            compute.join(timeout=5)
            sock.close(0)
            wake.close(0)
            self.ctx.term()

    def _on_message(self, sock, frames: list[bytes]) -> bool:
        """Handle one scheduler message; True means stop."""
        try:
            if len(frames) != 2:
                raise protocol.ProtocolError("bad_frames", f"expected 2 frames, got {len(frames)}")
            kind = protocol.parse_header(frames[0], {protocol.Kind.REGISTERED, protocol.Kind.BATCH, protocol.Kind.CANCEL_ROWS, protocol.Kind.WORKER_STOP})
            msg = protocol.decode(kind, frames[1])
        except protocol.ProtocolError as exc:
            log.warning("ignoring a malformed scheduler message: %s", exc)
            return False
        if kind is protocol.Kind.REGISTERED:
            self.heartbeat_interval_s = max(0.05, float(msg.heartbeat_interval_s))
            self.registered.set()
            log.info("registered with %s as %s", self.endpoint, self.worker_id)
        elif kind is protocol.Kind.BATCH:
            self._inbox.put(msg)
        elif kind is protocol.Kind.CANCEL_ROWS:
            with self._cancel_lock:
                self._cancelled.setdefault(msg.batch_id, set()).update(msg.request_ids)
        elif kind is protocol.Kind.WORKER_STOP:
            if msg.reason == "reregister":
                self.registered.clear()
                sock.send_multipart(self._register_msg())
            else:
                log.info("scheduler asked us to stop: %s", msg.reason)
                return True
        return False

    def stop(self) -> None:
        self._stop.set()


def _wire_dict(arrays: dict | None) -> dict | None:
    if arrays is None:
        return None
    return {k: protocol.array_to_wire(np.ascontiguousarray(v)) for k, v in arrays.items()}


def build_adapter(kind: str, model_dir: str | None, device: str, capacity: int | None):
    if kind == "null":
        from candidate_scheduler.worker.null_adapter import NullAdapter

        return NullAdapter(capacity or 8)
    if kind == "cosmos3":
        from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

        if model_dir is None:
            raise SystemExit("--model DIR is required for the cosmos3 adapter")
        return Cosmos3CandidateAdapter(model_dir, device=device, max_candidates_per_batch=capacity or 8)
    raise SystemExit(f"unknown adapter {kind!r}")
