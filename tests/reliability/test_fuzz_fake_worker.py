"""Fuzzing the worker link from the inside: a fake worker takes real batches and answers them with
structure-aware corruptions of real BATCH_RESULTs (split from test_fuzz.py, whose oracle and checks
it shares: every group gets exactly one reply, and a `done` one is the fault-free result)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import numpy as np
import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.client import make_request
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.reliability.helpers import IMAGE, Ledger, ReplyReader, health, null_capability

pytestmark = pytest.mark.timeout(900)

# ---- a fake worker on the link: structure-aware faults in real BATCH_RESULTs -------------------------------


RESULT_MUTATIONS = [
    "outputs:drop", "outputs:extra", "output:wrong-request", "output:wrong-ids",
    "output:wrong-shape", "output:wrong-batch-axis", "output:nan", "output:bad-status", "output:no-actions",
    "output:array-lie", "result:wrong-batch-id", "result:foreign-worker-id", "result:garbage",
    "result:truncated", "result:duplicate", "result:silence", "result:late",
]


class FakeWorker(threading.Thread):
    """Registers like a null worker and answers each BATCH with a (usually) corrupted BATCH_RESULT.
    Heartbeats report the batch as busy until it is answered, like the real worker."""

    def __init__(self, endpoint: str, rnd: random.Random, other_worker_id: str):
        super().__init__(daemon=True, name="fake-worker")
        self.endpoint = endpoint
        self.rnd = rnd
        self.other = other_worker_id
        self.worker_id = "fake-worker"
        self.stop = threading.Event()
        self.applied = Counter()
        self.adapter = NullAdapter(8)
        self.error: BaseException | None = None

    def _result(self, batch: protocol.BatchMsg) -> protocol.BatchResultMsg:
        from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

        items = [GroupWork(g.request_id, protocol.array_from_wire(g.images), list(g.prompts),
                           SamplingSpec(**{k: getattr(g.sampling, k) for k in g.sampling.__struct_fields__}),
                           [CandidateWork(c.candidate_id, c.seed, c.snapshot) for c in g.candidates])
                 for g in batch.groups]
        outs, _report = self.adapter.run_batch(items)
        msgs = [protocol.GroupOutputMsg(o.request_id, o.status, list(o.candidate_ids),
                                 None if o.actions is None else protocol.array_to_wire(np.asarray(o.actions, np.float32)))
                for o in outs]
        return protocol.BatchResultMsg(self.worker_id, batch.batch_id, msgs, {})

    def _mutate(self, what: str, res: protocol.BatchResultMsg) -> list[list[bytes]]:
        import msgspec

        outs = list(res.outputs)
        i = self.rnd.randrange(len(outs))
        o = outs[i]
        acts = protocol.array_from_wire(o.actions) if o.actions is not None else np.zeros((1, 1, 16, 7), np.float32)
        if what == "outputs:drop":
            outs.pop(i)
        elif what == "outputs:extra":
            outs.append(o)
        elif what == "output:wrong-request":
            outs[i] = msgspec.structs.replace(o, request_id=o.request_id + "x")
        elif what == "output:wrong-ids":
            outs[i] = msgspec.structs.replace(o, candidate_ids=[c + 1 for c in o.candidate_ids])
        elif what == "output:wrong-shape":
            outs[i] = msgspec.structs.replace(o, actions=protocol.array_to_wire(np.ascontiguousarray(acts[..., :-1])))
        elif what == "output:wrong-batch-axis":
            outs[i] = msgspec.structs.replace(o, actions=protocol.array_to_wire(np.concatenate([acts, acts], axis=1)))
        elif what == "output:nan":
            bad = acts.copy()
            bad.reshape(-1)[0] = np.nan
            outs[i] = msgspec.structs.replace(o, actions=protocol.array_to_wire(bad))
        elif what == "output:bad-status":
            outs[i] = msgspec.structs.replace(o, status=self.rnd.choice(["", "OK", "partial"]))
        elif what == "output:no-actions":
            outs[i] = msgspec.structs.replace(o, actions=None)
        elif what == "output:array-lie":
            lie = self.rnd.choice([protocol.Array("object", [1], b"\x00" * 8), protocol.Array("float32", [2**31, 2**31], b""),
                                   protocol.Array("float32", [2**62, 2**62], b""), protocol.Array("<U4", [1], b"abcd"),
                                   protocol.Array("float32", [1, 1, 16, 7], b"\x00" * 5)])
            outs[i] = msgspec.structs.replace(o, actions=lie)
        res = msgspec.structs.replace(res, outputs=outs)
        frames = protocol.encode(protocol.Kind.BATCH_RESULT, res)
        if what == "result:wrong-batch-id":
            frames = protocol.encode(protocol.Kind.BATCH_RESULT, msgspec.structs.replace(res, batch_id=res.batch_id + 10**6))
        elif what == "result:foreign-worker-id":
            frames = protocol.encode(protocol.Kind.BATCH_RESULT, msgspec.structs.replace(res, worker_id=self.other))
        elif what == "result:garbage":
            frames = [frames[0], os.urandom(64)]
        elif what == "result:truncated":
            frames = [frames[0], frames[1][: len(frames[1]) // 2]]
        elif what == "result:duplicate":
            return [frames, frames]
        elif what == "result:silence":
            return []
        return [frames]

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, self.worker_id.encode())
        sock.connect(self.endpoint)
        # capacity 16 > the real worker's 8: the scheduler offers every batch to the fake first
        register = protocol.encode(protocol.Kind.REGISTER, protocol.RegisterMsg(self.worker_id, null_capability(16), 16, pid=os.getpid()))
        sock.send_multipart(register)
        busy: int | None = None
        mute_until = 0.0  # "late": no heartbeats until declared dead, then the (valid) result
        late: list[list[bytes]] = []
        last_beat = 0.0
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if now >= mute_until:
                    if late:
                        for f in late:
                            sock.send_multipart(f)
                        late = []
                        busy = None
                    if now - last_beat > 0.1:
                        sock.send_multipart(protocol.encode(protocol.Kind.HEARTBEAT, protocol.HeartbeatMsg(self.worker_id, busy, None)))
                        last_beat = now
                if not sock.poll(20):
                    continue
                frames = sock.recv_multipart()
                kind = protocol.parse_header(frames[0], {protocol.Kind.REGISTERED, protocol.Kind.BATCH, protocol.Kind.CANCEL_ROWS, protocol.Kind.WORKER_STOP})
                msg = protocol.decode(kind, frames[1])
                if kind is protocol.Kind.WORKER_STOP:
                    sock.send_multipart(register)
                elif kind is protocol.Kind.BATCH:
                    busy = msg.batch_id
                    what = "valid" if self.rnd.random() < 0.4 else self.rnd.choice(RESULT_MUTATIONS)
                    self.applied[what] += 1
                    res = self._result(msg)
                    if what == "result:late":
                        late = [protocol.encode(protocol.Kind.BATCH_RESULT, res)]
                        mute_until = time.monotonic() + 2.0  # > the scheduler's 1.5 s heartbeat timeout
                        continue
                    for f in self._mutate(what, res):
                        sock.send_multipart(f)
                    busy = None
        finally:
            sock.close(0)


def test_fuzz_worker_link_fake_worker_corrupts_real_batches(services, reliability, rng_seed):
    """A fake worker takes real batches and answers them with structure-aware corruptions (wrong
    outputs, ids, shapes, NaNs, lying arrays, foreign worker id or batch id, garbage, duplicates,
    silence, an answer after being declared dead). Every group: exactly one reply, the fault-free result."""
    sched = services.scheduler("--retry-limit", "30")
    services.worker(sched, capacity=8, step_delay=0.1)  # slow: most batches go to the (instant) fake
    real_id = next(iter(sched.wait_workers(1)["workers"]))
    rnd = random.Random(rng_seed)
    fake = FakeWorker(sched.worker, random.Random(rng_seed + 1), real_id)
    fake.start()
    try:
        sched.wait_workers(2)
        ledger = Ledger()
        reader = ReplyReader(sched.request, ledger)
        n = reliability.scale.fake_worker_groups
        for i in range(n):
            reader.send(make_request(IMAGE, "pick", request_id=f"fw-{i}", count=rnd.randint(1, 12),
                                     seed=rnd.randrange(2**31), reducer=rnd.choice(["mean", "medoid", "none"]),
                                     return_candidates=rnd.random() < 0.5))
            if i % 4 == 3:  # keep a few in flight so both workers (and co-batching) are used
                reader.wait_all(120)
        reader.wait_all(120)
        from tests.reliability.helpers import wait_quiescent

        wait_quiescent(sched, 30)
        reader.barrier()
        reader.close()
        summary = ledger.summary()
        done = ledger.statuses["done"]
        health(sched, "fake-worker fuzz")
    finally:
        fake.stop.set()
        fake.join(5)
    assert fake.error is None, repr(fake.error)
    assert sum(fake.applied.values()) >= n // 3, f"the fake worker got too few batches to mean much: {fake.applied}"
    corrupt = sum(v for k, v in fake.applied.items() if k != "valid")
    reliability.add("fuzz", "worker link: fake worker corrupting real BATCH_RESULTs ("
                    + ", ".join(f"{k} {v}" for k, v in sorted(fake.applied.items())) + ")", corrupt,
                    f"{summary['requests']} groups: {done} done = fault-free result, lost {summary['lost']}, "
                    f"duplicated {summary['duplicated']}, partial {summary['partial_aggregates']}",
                    ok=summary["lost"] == summary["duplicated"] == summary["partial_aggregates"] == 0)
    ledger.assert_clean(reliability)
    assert done == n, ledger.statuses
