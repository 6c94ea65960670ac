"""A scheduler the test plays against one real, in-process Worker: one ROUTER socket, messages sent and
read by hand (tests/integration/test_worker_leave.py, test_worker_faults.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.conftest import wait_for


class PlayedScheduler:
    def __init__(self, step_s: float = 0.05, register: bool = True, leave_first: bool = False, *,
                 adapter=None, worker_cls: type[Worker] = Worker, heartbeat_s: float = 0.2, sndhwm: int | None = None):
        """`sndhwm`: the worker's send high-water mark (ZMQ's default is 1000 messages), lowered to reach
        a full link in a second instead of minutes of outage."""
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.worker = worker_cls(f"tcp://127.0.0.1:{self.port}", adapter or NullAdapter(4), capacity=4, worker_id="w",
                                 warmup_shapes=[], step_delay_s=step_s, leave_grace_s=30.0)
        if sndhwm is not None:
            self.worker.ctx.setsockopt(zmq.SNDHWM, sndhwm)  # sockets made after this take it
        self.results: set[int] = set()  # batch ids answered, whenever they came
        self.outputs: dict[int, list[protocol.GroupOutputMsg]] = {}  # each answer's outputs, in order, appended
        self.given_back: set[int] = set()  # batch ids handed back unstarted (GIVE_BACK)
        self.beats: list[protocol.HeartbeatMsg] = []
        self.served: BaseException | None = None  # what `serve` raised, once it has returned
        if leave_first:  # a SIGTERM during the warm-up, before it serves
            self.worker.leave()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.identity = None
        if register:
            self.identity, _kind, _msg = self.next({protocol.Kind.REGISTER})
            self.send(protocol.Kind.REGISTERED, protocol.RegisteredMsg("w", heartbeat_s))
            wait_for(self.worker.registered.is_set, 5, "registered")

    def _serve(self) -> None:
        try:
            self.worker.serve()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.served = exc

    def send(self, kind, msg) -> None:
        self.sock.send_multipart([self.identity, *protocol.encode(kind, msg)])

    def batch(self, batch_id: int, steps: int, kind: protocol.Kind = protocol.Kind.BATCH, *request_ids: str) -> None:
        """An assignment of one-candidate groups (one, "g<batch_id>", unless `request_ids` names them)."""
        sampling = convert.sampling_to_wire(SamplingSpec(steps=steps))
        groups = [protocol.GroupWorkMsg(rid, protocol.array_to_wire(np.zeros((1, 16, 16, 3), np.uint8)),
                                        ["pick"], sampling, [protocol.CandidateMsg(0, abs(batch_id))])
                  for rid in request_ids or (f"g{batch_id}",)]
        self.send(kind, protocol.BatchMsg(batch_id, groups))

    def next(self, kinds, timeout_s: float = 10.0):
        """The worker's next message of one of `kinds` (results are kept, heartbeats skipped): (identity,
        kind, msg)."""
        deadline = time.monotonic() + timeout_s
        while self.sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            identity, *frames = self.sock.recv_multipart()
            kind, msg = protocol.decode_frames(frames, protocol.WORKER_KINDS)
            if kind is protocol.Kind.BATCH_RESULT:
                self.results.add(msg.batch_id)
                self.outputs.setdefault(msg.batch_id, []).extend(msg.outputs)
            elif kind is protocol.Kind.HEARTBEAT:
                self.beats.append(msg)
            elif kind is protocol.Kind.GIVE_BACK:
                self.given_back.update(msg.batch_ids)
            if kind in kinds:
                return identity, kind, msg
            if time.monotonic() > deadline:
                break
        raise TimeoutError(f"no {kinds} within {timeout_s} s")

    def holding(self, batch_id: int) -> None:
        """Until a heartbeat lists `batch_id` among what the worker holds."""
        while batch_id not in self.next({protocol.Kind.HEARTBEAT})[2].running:
            pass

    def gone(self, within_s: float) -> None:
        self.thread.join(within_s)
        assert not self.thread.is_alive()

    def close(self) -> None:
        self.worker.stop()
        self.thread.join(10)
        self.sock.close(0)
        self.ctx.term()
