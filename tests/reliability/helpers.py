"""Shared helpers of the reliability suite: sizes, raw sockets, reply ledgers and result oracles.

The null worker is deterministic (a candidate's action = f(its seed, the observation mean)), so every
"done" reply can be checked bit for bit against `expected_reply(request)`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.core import reducers
from candidate_scheduler.core.spec import CandidateTrajectorySpec
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.client import make_request, synthetic_image
from candidate_scheduler.worker.null_adapter import NullAdapter

IMAGE = synthetic_image(64, 64, seed=3)
STATUSES = frozenset({"done", "failed", "cancelled", "expired", "rejected", "overloaded", "invalid"})
ERROR_CODES = frozenset({"bad_frames", "version", "unknown_kind", "bad_type", "bad_msgpack", "oversize"})


@dataclass(frozen=True)
class Scale:
    """How much each test does: the short run is sized for `make test` on 2 cores."""

    fuzz_request: int
    fuzz_control: int
    fuzz_worker: int
    fuzz_compat: int
    fuzz_bursts: int
    fake_worker_groups: int
    fault_groups: int
    kills: int
    stops: int
    restart_groups: int
    cancel_races: int
    cancel_lanes: int
    storm_ids: int
    load_clients: int
    load_groups: int
    soak_s: float


SHORT = Scale(fuzz_request=500, fuzz_control=300, fuzz_worker=300, fuzz_compat=300, fuzz_bursts=3,
              fake_worker_groups=30, fault_groups=40, kills=2, stops=2, restart_groups=8, cancel_races=60,
              cancel_lanes=4, storm_ids=3, load_clients=16, load_groups=12, soak_s=20.0)
LONG = Scale(fuzz_request=6000, fuzz_control=3000, fuzz_worker=3000, fuzz_compat=3000, fuzz_bursts=10,
             fake_worker_groups=300, fault_groups=400, kills=10, stops=6, restart_groups=24, cancel_races=600,
             cancel_lanes=8, storm_ids=20, load_clients=64, load_groups=50, soak_s=180.0)


# ---- expected results --------------------------------------------------------------------------------


def expected_reply(req: protocol.SubmitRequest) -> dict:
    """What a fault-free null worker + this scheduler answer for `req` (assumed valid): action,
    candidates (None unless asked for / reducer none), chosen candidate, candidate seeds."""
    c = req.candidates
    spec = CandidateTrajectorySpec(count=c.count, reducer=c.reducer, return_candidates=c.return_candidates,
                                   seed_policy=c.seed_policy, seeds=tuple(c.seeds) if c.seeds is not None else None)
    seeds = spec.candidate_seeds(req.seed)
    images = protocol.array_from_wire(req.images)
    if not req.batched:
        images = images[None]
    sampling = SamplingSpec(horizon=req.sampling.horizon, raw_action_dim=req.sampling.raw_action_dim)
    means = [float(np.asarray(img, dtype=np.float64).mean()) for img in images]
    stacked = np.stack([np.stack([NullAdapter.expected(s, m, sampling) for m in means]) for s in seeds])  # [N,B,H,D]
    red = reducers.reduce_full(c.reducer, stacked.astype(np.float32))
    action = red.action
    cands = stacked.astype(np.float32) if (c.return_candidates or c.reducer == "none") else None
    if not req.batched:
        action = None if action is None else action[0]
        cands = None if cands is None else cands[:, 0]
    return {"action": action, "candidates": cands, "chosen": red.chosen_candidate, "seeds": list(seeds)}


def check_result(req: protocol.SubmitRequest | None, result: protocol.GroupResult) -> tuple[str, str | None]:
    """Classify one RESULT: ("ok", None), ("partial", why) -- an aggregate that is not a full, right-shaped
    answer, or an action on an error status -- or ("wrong", why) -- a done answer with wrong values."""
    if result.status not in STATUSES:
        return "partial", f"unknown status {result.status!r}"
    if result.status != "done":
        if result.action is not None or result.candidates is not None:
            return "partial", f"status {result.status} carries an action"
        if not result.error and not result.error_code:
            return "partial", f"status {result.status} without an error"
        return "ok", None
    if req is None:
        return "ok", None
    if result.request_id != req.request_id:
        return "wrong", f"reply names {result.request_id!r}, request was {req.request_id!r}"
    want = expected_reply(req)
    got_action = None if result.action is None else protocol.array_from_wire(result.action)
    got_cands = None if result.candidates is None else protocol.array_from_wire(result.candidates)
    for name, got, exp in (("action", got_action, want["action"]), ("candidates", got_cands, want["candidates"])):
        if (got is None) != (exp is None):
            return "partial", f"done reply: {name} is {'missing' if got is None else 'unexpected'}"
        if got is not None and got.shape != exp.shape:
            return "partial", f"done reply: {name} shape {list(got.shape)} != {list(exp.shape)}"
        if got is not None and got.tobytes() != exp.astype(np.float32).tobytes():
            return "wrong", f"done reply: {name} differs from the fault-free result"
    if list(result.candidate_seeds) != want["seeds"]:
        return "wrong", "candidate seeds differ"
    if want["chosen"] is not None and result.chosen_candidate != want["chosen"]:
        return "wrong", f"chosen candidate {result.chosen_candidate} != {want['chosen']}"
    return "ok", None


def random_request(rnd, *, request_id: str, max_count: int = 12, image=IMAGE, steps=(2, 6), **overrides) -> protocol.SubmitRequest:
    """A valid, varied SUBMIT (count, reducer, seeds policy, return_candidates)."""
    count = rnd.randint(1, max_count)
    reducer = rnd.choice(("mean", "median", "medoid", "none"))
    kwargs = dict(count=count, reducer=reducer, return_candidates=rnd.random() < 0.3, seed=rnd.randrange(2**31),
                  seed_policy=rnd.choice(("per_candidate", "offset")), steps=rnd.randint(*steps))
    kwargs.update(overrides)
    return make_request(image, "pick up the red cube", request_id=request_id, **kwargs)


# ---- raw sockets ---------------------------------------------------------------------------------------


class RawPeer:
    """A DEALER that sends raw frames and reads raw replies (the leading b"" delimiter, if any, removed)."""

    def __init__(self, endpoint: str, identity: bytes | None = None, ctx: zmq.Context | None = None, curve=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        if curve is not None:
            self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = curve
        self.sock.connect(endpoint)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout_s: float) -> list[bytes] | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        frames = self.sock.recv_multipart()
        if frames and frames[0] == b"":
            frames = frames[1:]
        return frames

    def close(self) -> None:
        self.sock.close(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- counting replies ------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """Every request sent and every reply seen, per request_id: lost / duplicated / partial / wrong."""

    requests: dict[str, protocol.SubmitRequest] = field(default_factory=dict)
    replies: dict[str, list[protocol.GroupResult]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, req: protocol.SubmitRequest) -> None:
        with self.lock:
            assert req.request_id not in self.requests, f"test bug: request id {req.request_id} reused"
            self.requests[req.request_id] = req

    def got(self, result: protocol.GroupResult) -> None:
        with self.lock:
            self.replies[result.request_id].append(result)
            self.statuses[result.status] += 1

    @property
    def lost(self) -> list[str]:
        return [rid for rid in self.requests if not self.replies.get(rid)]

    @property
    def duplicated(self) -> list[str]:
        return [rid for rid, r in self.replies.items() if len(r) > 1]

    @property
    def unsolicited(self) -> list[str]:
        return [rid for rid in self.replies if rid not in self.requests]

    def verdicts(self) -> Counter:
        out = Counter()
        self.problems = []
        for rid, results in self.replies.items():
            for r in results:
                verdict, why = check_result(self.requests.get(rid), r)
                out[verdict] += 1
                if why:
                    self.problems.append(f"{rid}: {why}")
        return out

    def summary(self) -> dict:
        v = self.verdicts()
        return {"requests": len(self.requests), "replies": sum(len(r) for r in self.replies.values()),
                "lost": len(self.lost), "duplicated": len(self.duplicated) + len(self.unsolicited),
                "partial_aggregates": v["partial"], "wrong_results": v["wrong"]}

    def assert_clean(self, reliability=None) -> dict:
        s = self.summary()
        if reliability is not None:
            reliability.tally(**s)
        assert not self.lost, f"lost replies: {self.lost[:10]}"
        assert not self.duplicated, f"duplicated replies: {self.duplicated[:10]}"
        assert not self.unsolicited, f"replies for requests never sent: {self.unsolicited[:10]}"
        assert s["partial_aggregates"] == 0 and s["wrong_results"] == 0, self.problems[:10]
        return s


class ReplyReader:
    """A DEALER for SUBMITs whose every RESULT goes into a ledger; `drain` waits for outstanding
    replies, then a PING barrier proves nothing else is queued for this connection."""

    def __init__(self, endpoint: str, ledger: Ledger):
        self.peer = RawPeer(endpoint)
        self.ledger = ledger
        self.outstanding: set[str] = set()
        self.errors: list[protocol.ErrorReply] = []
        self._nonce = 0

    def send(self, req: protocol.SubmitRequest) -> None:
        self.ledger.sent(req)
        self.outstanding.add(req.request_id)
        self.peer.send(protocol.encode(protocol.Kind.SUBMIT, req))

    def _take(self, frames) -> protocol.Kind:
        kind, msg = protocol.decode_frames(frames, {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})
        if kind is protocol.Kind.RESULT:
            self.ledger.got(msg)
            self.outstanding.discard(msg.request_id)
        elif kind is protocol.Kind.ERROR:
            self.errors.append(msg)
        return kind

    def poll_once(self, timeout_s: float) -> bool:
        frames = self.peer.recv(timeout_s)
        if frames is None:
            return False
        self._take(frames)
        return True

    def wait(self, request_id: str, timeout_s: float) -> protocol.GroupResult:
        deadline = time.monotonic() + timeout_s
        while request_id in self.outstanding:
            if not self.poll_once(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                raise TimeoutError(f"no reply for {request_id!r} within {timeout_s} s")
        return self.ledger.replies[request_id][-1]

    def wait_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.outstanding and time.monotonic() < deadline:
            self.poll_once(min(0.5, max(0.0, deadline - time.monotonic())))

    def barrier(self, timeout_s: float = 10.0) -> None:
        """Send a PING and read everything up to its PONG: any reply the scheduler had already sent to this
        connection (a duplicate included) is in the ledger afterwards."""
        self._nonce += 1
        self.peer.send(protocol.encode(protocol.Kind.PING, protocol.Ping(self._nonce)))
        deadline = time.monotonic() + timeout_s
        while True:
            frames = self.peer.recv(max(0.0, deadline - time.monotonic()))
            if frames is None:
                raise TimeoutError("no PONG: the request socket stopped answering")
            kind, msg = protocol.decode_frames(frames, {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})
            if kind is protocol.Kind.PONG and msg.nonce == self._nonce:
                return
            if kind is not protocol.Kind.PONG:
                self._take(frames)

    def close(self) -> None:
        self.peer.close()


# ---- the scheduler process --------------------------------------------------------------------------------


def control(handle, kind: protocol.Kind, payload, timeout_s: float = 10.0) -> protocol.ControlReply:
    with handle.client() as c:
        return c.control(kind, payload, timeout_s=timeout_s)


def stats(handle) -> dict:
    with handle.client() as c:
        return c.stats()


def wait_quiescent(handle, timeout_s: float = 30.0) -> dict:
    """Until the scheduler holds no group and no batch (cancelled rows drained from the workers)."""
    from tests.conftest import wait_for

    def idle():
        s = stats(handle)
        return s if s["groups_in_flight"] == 0 and s["batches_in_flight"] == 0 else None

    return wait_for(idle, timeout_s, "no group and no batch in flight")


def proc_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fault_lines(proc) -> Counter:
    """`fault-injected kind=K` lines a worker logged (workers/faults.py)."""
    import re

    pat = re.compile(r"fault-injected kind=(\w+)")
    return Counter(m.group(1) for line in list(proc.lines) if (m := pat.search(line)))


def health(handle, what: str) -> dict:
    """The scheduler is alive and no exception escaped a handler during `what`; its stats."""
    assert handle.proc.alive(), f"the scheduler died during {what}; log: {handle.proc.log_path}"
    s = stats(handle)
    assert s["handler_errors"] == 0, f"an exception escaped a handler during {what}; log: {handle.proc.log_path}"
    return s


def null_capability(capacity: int = 8) -> dict:
    return NullAdapter(capacity).capability_dict()
