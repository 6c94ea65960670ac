"""The scheduler with a null worker (no model work): admission throughput over ZMQ with 1,000 groups
sent at once, end-to-end groups/s, one-at-a-time round trips, and the pure in-process admission cost."""

from __future__ import annotations

import time

import numpy as np

from candidate_scheduler.bench.common import PROMPT, summary_stats
from candidate_scheduler.bench.settings import NULL_CAPACITY, REDUCER
from candidate_scheduler.service.launcher import SchedulerHandle


def pure_admission(n_groups: int, count: int, capacity: int, rounds: int) -> dict:
    """admission.decide + GroupState.admit for n_groups queued groups, in process (no IO)."""
    from candidate_scheduler.core.admission import AdmissionPolicy, decide
    from candidate_scheduler.core.group_state import GroupState
    from candidate_scheduler.core.spec import CandidateTrajectorySpec, ModelCapability
    from candidate_scheduler.worker.null_adapter import NullAdapter

    capability = ModelCapability.from_dict(NullAdapter(capacity).capability_dict())
    spec = CandidateTrajectorySpec(count=count, reducer=REDUCER)
    per_round = []
    for r in range(rounds):
        states = [GroupState.from_request(f"pure-{r}-{i}", spec, i, clock=time.perf_counter) for i in range(n_groups)]
        lat = []
        clock = time.perf_counter
        t_all = clock()
        for st in states:
            t0 = clock()
            decision = decide(spec, capability, action_mode="policy", policy=AdmissionPolicy.MICROBATCH,
                              batch_capacity=capacity)
            if not st.admit(decision):
                raise RuntimeError("pure admission rejected a group")
            lat.append(clock() - t0)
        total = clock() - t_all
        per_round.append({"total_s": total, "groups_per_s": n_groups / total, "latency": summary_stats(lat)})
    best = sorted(per_round, key=lambda x: x["total_s"])[len(per_round) // 2]  # the median round
    return {
        "groups": n_groups, "count": count, "capacity": capacity, "rounds": rounds,
        "groups_per_s": best["groups_per_s"],
        "latency_p50_us": best["latency"]["median"] * 1e6,
        "latency_p99_us": best["latency"]["p99"] * 1e6,
        "per_round_groups_per_s": [r["groups_per_s"] for r in per_round],
    }


def null_worker_bench(service: SchedulerHandle, n_groups: int, count: int, bursts: int, progress) -> dict:
    """1,000 groups sent at once to a scheduler with one null worker.

    Admission throughput: the scheduler handles its request socket one message at a time, so a PING
    sent behind the burst on the same connection is answered only after every SUBMIT before it was
    validated and admitted: groups / (PONG time - first send). End to end: groups / (last reply -
    first send), and each group's time to its reply."""
    import zmq

    from candidate_scheduler import protocol
    from candidate_scheduler.service.client import make_request, synthetic_image

    image = synthetic_image(64, 64, seed=3)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
    sock.connect(service.request)
    allowed = {protocol.Kind.RESULT, protocol.Kind.PONG, protocol.Kind.ERROR}

    def burst(tag: str, n: int) -> dict:
        frames = [
            protocol.encode(protocol.Kind.SUBMIT, make_request(image, PROMPT, request_id=f"{tag}-{i}", count=count, seed=i,
                                                 reducer=REDUCER, height=64, width=64, steps=4))
            for i in range(n)
        ]
        nonce = abs(hash(tag)) % (1 << 31)
        t0 = time.perf_counter()
        for f in frames:
            sock.send_multipart(f)
        t_sent = time.perf_counter()
        sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(nonce)))
        t_pong = None
        done_at: list[float] = []
        statuses: dict[str, int] = {}
        while t_pong is None or len(done_at) < n:
            if not sock.poll(120_000):
                raise TimeoutError(f"null burst {tag}: {len(done_at)}/{n} replies, pong={t_pong is not None}")
            msg = sock.recv_multipart()
            now = time.perf_counter()
            kind, body = protocol.decode_frames(msg, allowed)
            if kind is protocol.Kind.PONG:
                t_pong = now
            elif kind is protocol.Kind.ERROR:
                raise RuntimeError(f"null burst {tag}: {body.error_code}: {body.error}")
            else:
                done_at.append(now)
                statuses[body.status] = statuses.get(body.status, 0) + 1
        lat = [t - t0 for t in done_at]
        return {
            "groups": n,
            "send_s": t_sent - t0,
            "admitted_s": t_pong - t0,
            "admitted_groups_per_s": n / (t_pong - t0),
            "e2e_s": max(done_at) - t0,
            "e2e_groups_per_s": n / (max(done_at) - t0),
            "reply_latency_p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "reply_latency_p99_ms": float(np.percentile(lat, 99)) * 1e3,
            "statuses": statuses,
        }

    def one_at_a_time(tag: str, n: int) -> list[float]:
        """Round trips of single groups with nothing else queued: the scheduler path's own latency
        (client -> scheduler -> null worker -> scheduler -> client) with no model work."""
        lat = []
        for i in range(n):
            frames = protocol.encode(protocol.Kind.SUBMIT, make_request(image, PROMPT, request_id=f"{tag}-{i}", count=count,
                                                          seed=i, reducer=REDUCER, height=64, width=64, steps=4))
            t0 = time.perf_counter()
            sock.send_multipart(frames)
            if not sock.poll(60_000):
                raise TimeoutError(f"null round trip {tag}-{i}: no reply")
            msg = sock.recv_multipart()
            lat.append(time.perf_counter() - t0)
            if protocol.parse_header(msg[0], allowed) is not protocol.Kind.RESULT:
                raise RuntimeError(f"null round trip {tag}-{i}: unexpected reply")
        return lat

    try:
        burst("null-warm", 50)
        progress.update(1)
        runs = []
        for b in range(bursts):
            runs.append(burst(f"null-{b}", n_groups))
            progress.update(1)
        round_trip = one_at_a_time("null-rt", 200)
    finally:
        sock.close(0)
    med = sorted(runs, key=lambda r: r["admitted_groups_per_s"])[len(runs) // 2]
    return {
        "groups": n_groups, "count": count, "capacity": NULL_CAPACITY, "bursts": bursts,
        "admitted_groups_per_s": med["admitted_groups_per_s"],
        "e2e_groups_per_s": float(np.median([r["e2e_groups_per_s"] for r in runs])),
        "reply_latency_p50_ms": float(np.median([r["reply_latency_p50_ms"] for r in runs])),
        "reply_latency_p99_ms": float(np.median([r["reply_latency_p99_ms"] for r in runs])),
        "all_done": all(r["statuses"] == {"done": r["groups"]} for r in runs),
        "round_trip_ms": {k: (v * 1e3 if v is not None else None) for k, v in summary_stats(round_trip).items() if k != "n"},
        "runs": runs,
    }
