"""A client host's side of tests/integration/test_multihost.py, run inside the client's namespace:
`python remote_client.py JOB.json` prints one JSON line of what it saw. JOB: request / control
endpoints (as this host reaches them), keys_dir, scenario."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.client import Client, Forbidden, SchedulerUnavailable, make_request, synthetic_image
from candidate_scheduler.service.keys import ClientKeys

IMAGE = synthetic_image()


def client(job: dict, name: str | None, timeout_s: float = 30.0, request: str | None = None) -> Client:
    keys = None if name is None else ClientKeys.load(job["keys_dir"], name)
    return Client(request or job["request"], job["control"], timeout_s=timeout_s, keys=keys)


def keyed(job: dict) -> dict:
    out = {}
    with client(job, "robot-a") as a, client(job, "robot-b") as b:
        rid = a.send(make_request(IMAGE, "pick", count=2, steps=60, request_id="group-of-a"))
        deadline = time.monotonic() + 20
        while a.status(rid).state not in ("running", "done") and time.monotonic() < deadline:
            time.sleep(0.05)
        # each principal's ids are its own: b's "group-of-a" is nobody's, and a's must be named to be reached
        out["b_own_namespace"] = [b.status(rid).state, b.cancel(rid).state]
        cancel = b.cancel(rid, principal="robot-a")
        out["b_cancels_a"] = [cancel.ok, cancel.error_code]
        out["b_status_of_a"] = b.status(rid, principal="robot-a").error_code
        out["b_shutdown"] = b.shutdown().error_code
        out["b_drain"] = b.drain().error_code
        out["b_worker_leave"] = b.worker_leave("any-worker").error_code
        try:
            b.stats()
            out["b_stats"] = "allowed"
        except Forbidden:
            out["b_stats"] = "forbidden"
        out["b_own_group"] = b.submit(IMAGE, "pick", count=3, steps=4, timeout_s=30).status
        out["a_group"] = a.wait(rid, timeout_s=60).status
        out["a_status_after"] = a.status(rid).state
    with client(job, "admin") as admin:
        stats = admin.stats()
        out["admin_stats_security"] = stats["security"]
        out["workers"] = len(stats["workers"])
        out["admin_status_of_a"] = admin.status("group-of-a", principal="robot-a").state
        out["admin_status_own_namespace"] = admin.status("group-of-a").state
    return out


def refused(job: dict) -> dict:
    """A keyless client and a client with a key nobody authorised: no reply, nothing admitted (their groups
    would run 10 s: still in flight when asked, had either been taken)."""
    out = {}
    keyless = Client(job["request"], job["control"], timeout_s=3)
    rogue_public, rogue_secret = zmq.curve_keypair()
    server = ClientKeys.load(job["keys_dir"], "robot-a").server_public
    rogue = Client(job["request"], job["control"], timeout_s=3, keys=ClientKeys(server, rogue_public, rogue_secret))
    for name, c in (("keyless", keyless), ("wrong_key", rogue)):
        try:
            r = c.submit(IMAGE, "pick", count=1, steps=500, request_id=f"from-{name}", timeout_s=3)
            out[name] = r.status
        except (TimeoutError, SchedulerUnavailable):
            out[name] = "no reply"
        c.close()
    with client(job, "admin") as admin:
        out["in_flight_after"] = admin.stats()["groups_in_flight"]
    return out


class TamperingProxy:
    """A TCP relay on this host that flips one byte of the first client->scheduler chunk of at least
    `min_bytes`: the submission's MESSAGE command (its box no longer authenticates). Chosen by size, not
    by time: every handshake command is a few hundred bytes, and on a loaded host the handshake can end
    after any fixed delay (a tampered INITIATE only makes ZMQ reconnect, and the group then goes through)."""

    def __init__(self, target: str, min_bytes: int = 4096):
        host, port = target[len("tcp://"):].rsplit(":", 1)
        self.target = (host, int(port))
        self.min_bytes = min_bytes
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.tampered = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(conn, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, False), daemon=True).start()

    def _pump(self, src, dst, tamper: bool) -> None:
        try:
            while data := src.recv(65536):
                if tamper and not self.tampered and len(data) >= self.min_bytes:
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0x55
                    data = bytes(data)
                    self.tampered += 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass


def tampered(job: dict) -> dict:
    """A submission whose bytes are changed on the way: refused (its box does not authenticate), nothing
    admitted. Sent on a raw DEALER with the client's keys, not a Client: a Client sees the dropped
    connection and sends the group again, untampered, which then runs (what a client should do, but not
    what this test is about)."""
    proxy = TamperingProxy(job["request"])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    ClientKeys.load(job["keys_dir"], "robot-a").apply(sock)
    sock.connect(f"tcp://127.0.0.1:{proxy.port}")
    time.sleep(1.0)  # the handshake ends first (it would pass untouched anyway: its commands are small)
    sock.send_multipart(protocol.encode(protocol.Kind.SUBMIT, make_request(IMAGE, "pick", count=1, steps=4,
                                                                           request_id="tampered")))
    reply = "no reply" if not sock.poll(4000) else "answered"
    sock.close(0)
    with client(job, "admin") as admin:
        admitted = admin.status("tampered", principal="robot-a").state
    with client(job, "robot-a") as a:  # the same key, untampered, still served
        after = a.submit(IMAGE, "pick", count=1, steps=4, timeout_s=30).status
    return {"reply": reply, "tampered_chunks": proxy.tampered, "admitted": admitted, "untampered_after": after}


def http(job: dict) -> dict:
    """sglang's HTTP API on the scheduler's host (`candidate-scheduler http --tokens`): a bearer token in,
    none and a wrong one out."""
    import base64
    import io
    import urllib.error
    import urllib.request

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(IMAGE).save(buf, format="PNG")
    body = {"request_id": "over-http", "input": {"task": "pick", "observation": {"image": {
        "b64_json": base64.b64encode(buf.getvalue()).decode()}}},
        "parameters": {"height": 64, "width": 64, "num_inference_steps": 2, "action_horizon": 4, "domain_id": 0,
                       "raw_action_dim": 7, "guidance_scale": 1.0, "fps": 5, "seed": 3}}

    def post(token: str | None) -> int:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        req = urllib.request.Request(job["http"] + "/v1/actions/generations", data=json.dumps(body).encode(),
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    deadline = time.monotonic() + 240  # sglang's server imports for a while on the scheduler's host
    while True:
        try:
            with urllib.request.urlopen(job["http"] + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the HTTP server never became healthy")
        time.sleep(0.5)
    return {"no_token": post(None), "wrong_token": post("not-a-token"), "token": post(job["token"])}


if __name__ == "__main__":
    job = json.loads(open(sys.argv[1]).read())
    print(json.dumps({"keyed": keyed, "refused": refused, "tampered": tampered, "http": http}[job["scenario"]](job)), flush=True)
