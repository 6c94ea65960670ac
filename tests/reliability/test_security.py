"""Security checks: no pickle on any native socket, loopback-only default binds, and CURVE on a
remote worker link (keyless and unauthorised workers never register)."""

from __future__ import annotations

import importlib.util
import ipaddress
import pickle
import re
import shutil
import subprocess
import sys
import time
import urllib.parse

import numpy as np
import psutil
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from candidate_scheduler import protocol
from candidate_scheduler.service.client import make_request
from tests.conftest import ENV, ROOT, Proc, free_port, wait_for
from tests.reliability.fuzz import Evil, EvilShell
from tests.reliability.helpers import IMAGE, RawPeer, check_result, stats

pytestmark = pytest.mark.timeout(600)
CLI = [sys.executable, "-m", "candidate_scheduler.cli"]


def _compat_available() -> bool:
    return importlib.util.find_spec("candidate_scheduler.compat.bridge") is not None


def _evil_payloads(marker) -> list[bytes]:
    evil = [Evil(str(marker)), EvilShell(str(marker)), {"request_id": "x", "images": Evil(str(marker))}]
    return [pickle.dumps(e, protocol=p) for e in evil for p in (0, 2, 5)]


def test_no_pickle_is_ever_executed(services, reliability, tmp_path):
    """Pickles that would create a file, on every socket and under every message kind: the request
    and control sockets answer ERROR, the worker link and a worker's own socket ignore them, the compat
    bridge refuses them through its allow-list. The file never appears; everything keeps serving."""
    compat = _compat_available()
    sched = services.scheduler(compat=compat)
    worker = services.worker(sched, capacity=8)
    sched.wait_workers(1)
    marker = tmp_path / "pwned"
    payloads = _evil_payloads(marker)
    tried = {}

    def native(endpoint, kinds, reply_due: bool, name: str):
        n = 0
        with RawPeer(endpoint) as peer:
            for kind in kinds:
                for p in payloads:
                    for frames in ([protocol.header(kind), p], [b"", protocol.header(kind), p], [p]):
                        peer.send(frames)
                        n += 1
                        if reply_due:
                            reply = peer.recv(10)
                            assert reply is not None, (name, kind)
                            k, msg = protocol.decode_frames(reply, {protocol.Kind.ERROR})
                            assert msg.error_code in ("bad_msgpack", "bad_type", "bad_frames", "version",
                                                      "unknown_kind"), msg
            if not reply_due:  # barrier: REGISTERED(barrier id) comes after everything sent before it
                peer.send(protocol.encode(protocol.Kind.REGISTER, protocol.RegisterMsg("pickle-barrier", _null_cap(), 8)))
                while True:
                    reply = peer.recv(10)
                    assert reply is not None
                    k, msg = protocol.decode_frames(reply, {protocol.Kind.REGISTERED, protocol.Kind.WORKER_STOP})
                    if k is protocol.Kind.REGISTERED and msg.worker_id == "pickle-barrier":
                        break
        tried[name] = n

    native(sched.request, list(protocol.Kind), True, "request socket")
    native(sched.control, list(protocol.Kind), True, "control socket")
    native(sched.worker, list(protocol.WORKER_KINDS), False, "worker link")
    # pickle bytes as *data* inside a valid message are only ever data: a picklish image is just pixels
    blob = pickle.dumps(Evil(str(marker)))
    pixels = np.frombuffer((blob * (3 * 16 * 16 // len(blob) + 1))[: 3 * 16 * 16], np.uint8).reshape(16, 16, 3)
    req = make_request(pixels, blob.decode("latin-1"), request_id="picklish-data", count=2, height=16, width=16)
    with RawPeer(sched.request) as peer:
        peer.send(protocol.encode(protocol.Kind.SUBMIT, req))
        reply = peer.recv(30)
    assert reply is not None
    _k, res = protocol.decode_frames(reply, {protocol.Kind.RESULT})
    assert res.status == "done" and check_result(req, res) == ("ok", None)

    # the worker's own DEALER: a fake scheduler sends it pickles under every scheduler->worker kind
    tried["worker process's own DEALER (a fake scheduler sends)"] = _pickle_a_worker(services, payloads)

    if compat:
        n = 0
        with RawPeer(sched.compat) as peer:
            for p in payloads:
                peer.sock.send_multipart([b"", p])
                n += 1
                assert peer.sock.poll(30_000), "the compat bridge did not answer a refused pickle"
                reply = peer.sock.recv_multipart()
                from candidate_scheduler.compat.unpickle import safe_loads

                out = safe_loads(reply[-1])
                assert getattr(out, "error", None) or out.__dict__.get("error"), "a refused pickle got no error"
        tried["sglang compat socket"] = n
    assert not marker.exists(), "a pickle was executed"
    assert sched.proc.alive() and worker.alive()
    assert stats(sched)["handler_errors"] == 0
    for name, n in tried.items():
        held = ("ERROR reply each" if name in ("request socket", "control socket") else
                "allow-list refusal (OutputBatch.error) each" if name == "sglang compat socket" else "ignored")
        reliability.add("security", f"pickle that would create a file, on the {name}"
                        + (" (every kind x 3 frame shapes)" if name in ("request socket", "control socket", "worker link") else ""),
                        n, f"{held}; file never created; process alive")
    if not compat:
        reliability.add("security", "pickle on the sglang compat socket", 0,
                        "skipped: candidate_scheduler/compat_bridge.py does not exist yet")


def _null_cap() -> dict:
    from candidate_scheduler.worker.null_adapter import NullAdapter

    return NullAdapter(8).capability_dict()


def _pickle_a_worker(services, payloads) -> int:
    """A worker process connected to a ROUTER of ours: after the pickles it still registers and
    heartbeats."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    class _Handle:
        worker = f"tcp://127.0.0.1:{port}"
        workers: list = []

    proc = services.worker(_Handle(), "null", 8, 0.0)
    n = 0
    try:
        assert router.poll(60_000), "the worker never connected"
        identity, header, _payload = router.recv_multipart()
        assert protocol.parse_header(header, {protocol.Kind.REGISTER}) is protocol.Kind.REGISTER
        for kind in (protocol.Kind.REGISTERED, protocol.Kind.BATCH, protocol.Kind.CANCEL_ROWS, protocol.Kind.WORKER_STOP):
            for p in payloads:
                router.send_multipart([identity, protocol.header(kind), p])
                n += 1
        # still alive and speaking the protocol: it re-sends REGISTER (no REGISTERED came) within ~2 s
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert router.poll(int((deadline - time.monotonic()) * 1000)), "the worker went silent"
            frames = router.recv_multipart()
            if protocol.parse_header(frames[1], protocol.WORKER_KINDS) is protocol.Kind.REGISTER:
                break
        assert proc.alive()
    finally:
        router.close(0)
        proc.stop()
    return n


def _endpoint_hosts(lines) -> dict[str, str]:
    pat = re.compile(r"candidate-scheduler: (request endpoint|control endpoint|worker link|metrics|sglang compat)\s+(\S+)")
    out = {}
    for line in lines:
        m = pat.search(line)
        if m and m.group(2) != "off":
            out[m.group(1)] = urllib.parse.urlparse(m.group(2)).hostname
    return out


def _listening(pid: int) -> list[str]:
    procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    addrs = []
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        addrs += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]
    return addrs


def test_default_binds_are_loopback(tmp_path, reliability):
    """`serve` and `up` with no host flags: every printed endpoint and every listening socket of the
    process tree (scheduler, metrics exporter, compat bridge, workers) is on loopback."""
    from candidate_scheduler.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.worker_host is None
    checked = []
    for sub in ("serve", "up"):
        cmd = CLI + [sub, "--request-port", "0", "--control-port", "0", "--worker-port", "0", "--metrics-port", "0"]
        cmd += ["--compat-port", str(free_port())] if _compat_available() else ["--no-compat"]
        if sub == "up":
            cmd += ["--adapter", "null", "--workers", "1"]
        proc = Proc(cmd, tmp_path / f"{sub}.log")
        try:
            proc.wait_line(re.compile(r"candidate-scheduler: sglang compat"), 60)
            hosts = _endpoint_hosts(proc.lines)
            assert set(hosts) >= {"request endpoint", "control endpoint", "worker link", "metrics"}, hosts
            assert all(ipaddress.ip_address(h).is_loopback for h in hosts.values()), hosts
            expected_listeners = 4 + (1 if _compat_available() else 0)
            if sub == "up":
                wait_for(lambda: psutil.Process(proc.pid).children(), 30, "the worker child")
            addrs = wait_for(lambda: (a := _listening(proc.pid)) and len(a) >= expected_listeners and a, 60,
                             "every listener up")
            assert all(ipaddress.ip_address(a).is_loopback for a in addrs), addrs
            checked.append(f"{sub}: {len(addrs)} listeners ({', '.join(sorted(set(addrs)))})")
        finally:
            proc.stop()
    reliability.add("security", "default binds (`serve`, `up` with no host flags): printed endpoints + every "
                    "listening socket of the process tree", sum(int(c.split(": ")[1].split()[0]) for c in checked),
                    "all loopback: " + "; ".join(checked))


def _handshake_events(endpoint: str, curve=None, timeout_s: float = 20.0) -> list[str]:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = curve
    mon = s.get_monitor_socket()
    s.connect(endpoint)
    s.send_multipart(protocol.encode(protocol.Kind.REGISTER, protocol.RegisterMsg("raw-intruder", _null_cap(), 8)))
    events = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if mon.poll(int((deadline - time.monotonic()) * 1000)):
                name = zmq.Event(recv_monitor_message(mon)["event"]).name
                events.append(name)
                if name.startswith("HANDSHAKE"):
                    break
        assert not s.poll(0), "an unauthenticated peer got an answer"
    finally:
        s.disable_monitor()
        mon.close(0)
        s.close(0)
    return events


def test_remote_worker_link_refuses_workers_without_keys(services, reliability, tmp_path):
    """Worker link on 0.0.0.0 with --curve-dir: a keyless worker and a worker with valid-looking but
    unauthorised keys never register (ZMQ handshake refused, seen on a socket monitor); the authorised
    worker does, and serves."""
    import zmq.auth

    good, other, rogue = tmp_path / "keys", tmp_path / "other", tmp_path / "rogue"
    for d in (good, other):
        subprocess.run(CLI + ["keys", str(d)], check=True, capture_output=True, env=ENV, cwd=ROOT)
    rogue.mkdir()  # a worker with its own key pair that nobody authorised, and the real server key
    shutil.copy(other / "worker.key_secret", rogue / "worker.key_secret")
    shutil.copy(good / "server.key", rogue / "server.key")
    sched = services.scheduler("--worker-host", "0.0.0.0", "--curve-dir", str(good))
    port = sched.worker.rsplit(":", 1)[1]
    sched.worker = f"tcp://127.0.0.1:{port}"
    keyless = services.worker(sched, "null", 8, 0.0)
    unauthorised = services.worker(sched, "null", 8, 0.0, "--curve-dir", str(rogue))
    ev_keyless = _handshake_events(sched.worker)
    srv_pub, _ = zmq.auth.load_certificate(str(good / "server.key"))
    cli_pub, cli_sec = zmq.auth.load_certificate(str(other / "worker.key_secret"))
    ev_rogue = _handshake_events(sched.worker, (cli_pub, cli_sec, srv_pub))
    assert "HANDSHAKE_FAILED_PROTOCOL" in ev_keyless or "HANDSHAKE_FAILED_NO_DETAIL" in ev_keyless, ev_keyless
    assert "HANDSHAKE_FAILED_AUTH" in ev_rogue, ev_rogue
    authorised = services.worker(sched, "null", 8, 0.0, "--curve-dir", str(good))
    registered = sched.wait_workers(1, timeout_s=60)["workers"]
    # the keyless and rogue workers started first and retry REGISTER every 2 s; they stay out
    assert len(registered) == 1 and f"-{authorised.pid}-" in next(iter(registered)), registered
    assert keyless.alive() and unauthorised.alive()
    with sched.client() as c:
        r = c.submit(IMAGE, "pick", count=2, timeout_s=30)
        assert r.status == "done"
        assert set(c.stats()["workers"]) == set(registered)
    reliability.add("security", "worker link on 0.0.0.0 with CURVE (`candidate-scheduler keys`): keyless and "
                    "unauthorised-key workers + raw peers", 4,
                    f"never registered (monitor: {ev_keyless[-2:]}, {ev_rogue[-2:]}); the authorised worker "
                    "registered and served")
