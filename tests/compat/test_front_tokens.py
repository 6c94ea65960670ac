"""Bearer tokens on the two HTTP-ish fronts (issue #22): the openpi websocket and sglang's HTTP server.

- openpi: `serve --curve-dir DIR --openpi-port 0` (the front's tokens default to the key directory; the
  front reaches the CURVE scheduler with the run-time proxy pair `serve` hands it). openpi's own client
  (its venv: a robot process) with the right `api_key` gets actions, and its group counts against the
  token's tenant; with no key or a wrong one the handshake is an HTTP 401 and the scheduler receives
  nothing. A null worker (no model) keeps it fast.
- sglang HTTP: `candidate-scheduler http --tokens DIR` in front of a compat bridge and the fake native
  scheduler: POST with the right bearer token is answered, without or with a wrong one it is a 401.
- a non-loopback bind without tokens is refused with one stderr line (exit 2), for the front, `serve`
  and `http`.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import websockets.exceptions
import websockets.sync.client

from candidate_scheduler.service import keys
from candidate_scheduler.service.client import Client, synthetic_image
from candidate_scheduler.service.openpi import msgpack_numpy
from candidate_scheduler.service.processes import ChildProcess
from tests.conftest import Services, wait_for
from tests.tls_files import CERT, KEY, client_context

from . import openpi_client_env
from .conftest import ENV, ROOT

pytestmark = pytest.mark.sglang

OPENPI_LINE = re.compile(r"candidate-scheduler: openpi policy\s+(wss?://\S+)")
READY = re.compile(r"openpi front: listening on (ws://\S+)")
HOLD_STEPS = 60  # x the worker's 0.03 s step delay: a group that stays in flight ~2 s
STEP_DELAY_S = 0.03

# openpi's WebsocketClientPolicy in the client venv: argv = url, job.json; prints one JSON line per attempt
ROBOT = r"""
import json, sys
import numpy as np
from openpi_client import websocket_client_policy
url, attempts = sys.argv[1], json.load(open(sys.argv[2]))
for a in attempts:
    try:
        policy = websocket_client_policy.WebsocketClientPolicy(url, api_key=a["api_key"])
    except Exception as exc:
        response = getattr(exc, "response", None)
        print(json.dumps({"ok": False, "error_type": type(exc).__name__, "error": str(exc),
                          "status": getattr(response, "status_code", None),
                          "body": (getattr(response, "body", b"") or b"").decode(errors="replace")}), flush=True)
        continue
    rng = np.random.default_rng(0)
    obs = {"observation/image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "prompt": "pick", "seed": 3,
           "sampling": {"steps": a["steps"], "horizon": 4}}
    reply = policy.infer(obs)
    print(json.dumps({"ok": True, "shape": list(reply["actions"].shape), "seed": int(reply["seed"]),
                      "request_id": reply["request_id"]}), flush=True)
"""


def _one_line_refusal(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _received(metrics_url: str) -> float:
    """groups_received_total (every api) from the scheduler's /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^\S*groups_received_total\{[^}]*\} (\S+)$", text, re.M))


# ---- key directory, secured scheduler, openpi front -------------------------------------------------------


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    keys.init_dir(d)
    keys.add_token(d, "robot-a", "client", "fleet-a")
    keys.add_token(d, "web-c", "client", "web")
    return d


def token(key_dir: Path, name: str) -> str:
    return keys.read_token(key_dir / f"{name}.token")


class Secured:
    def __init__(self, handle, openpi_url: str, key_dir: Path):
        self.handle, self.openpi_url = handle, openpi_url
        self.admin = Client(handle.request, handle.control, timeout_s=30, keys=keys.ClientKeys.load(key_dir, "admin"))


@pytest.fixture(scope="module")
def secured(key_dir, tmp_path_factory):
    """`serve --curve-dir DIR --openpi-port 0` (tokens: the key directory's, by default) over TLS, as a
    front for robots on other hosts runs, and a null worker."""
    services = Services(tmp_path_factory.mktemp("secured"))
    try:
        handle = services.scheduler("--curve-dir", str(key_dir), "--openpi-port", "0", "--openpi-tls-cert", CERT,
                                    "--openpi-tls-key", KEY, metrics=True)
        url = next(m.group(1) for line in handle.proc.lines if (m := OPENPI_LINE.search(line)))
        services.worker(handle, "null", 8, STEP_DELAY_S, "--curve-dir", str(key_dir))
        s = Secured(handle, url, key_dir)
        wait_for(lambda: s.admin.stats()["workers"], 60, "the worker to register")
        yield s
        s.admin.close()
    finally:
        services.close()


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    """run(url, [{"api_key", "steps"}, ...], background=False) -> [result per attempt] (or the Popen)."""
    python = openpi_client_env.client_python()
    d = tmp_path_factory.mktemp("robot")
    (d / "robot.py").write_text(ROBOT)
    n = iter(range(1_000_000))

    def run(url: str, attempts: list[dict], background: bool = False, trusts_the_certificate: bool = True):
        job = d / f"job-{next(n)}.json"
        job.write_text(json.dumps([{"steps": 2, **a} for a in attempts]))
        cmd = [str(python), str(d / "robot.py"), url, str(job)]
        # openpi's client verifies wss:// against Python's default trust store, which SSL_CERT_FILE names
        env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        if trusts_the_certificate:
            env["SSL_CERT_FILE"] = CERT
        if background:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line) for line in proc.stdout.splitlines()]

    return run


def test_openpi_client_with_its_api_key_gets_actions_counted_against_its_tenant(secured, key_dir, robot):
    assert secured.openpi_url.startswith("wss://")
    [quick] = robot(secured.openpi_url, [{"api_key": token(key_dir, "robot-a")}])
    assert quick["ok"] and quick["shape"] == [4, 7] and quick["seed"] == 3, quick
    # a group held in flight (slow steps): the scheduler counts it against robot-a's tenant, fleet-a
    slow = robot(secured.openpi_url, [{"api_key": token(key_dir, "robot-a"), "steps": HOLD_STEPS}], background=True)
    def fleet_a_in_flight():
        tenants = secured.admin.stats()["tenants"]
        return tenants if tenants.get("fleet-a", {}).get("in_flight") else None

    try:
        tenants = wait_for(fleet_a_in_flight, 20, "the group in flight for fleet-a", interval_s=0.02)
        assert tenants["fleet-a"]["in_flight"] == 1
        assert not tenants.get("default", {}).get("in_flight"), tenants  # not the front's own (proxy) tenant
        out, err = slow.communicate(timeout=30)
    finally:
        slow.kill()
    [held] = [json.loads(line) for line in out.splitlines()]
    assert slow.returncode == 0 and held["ok"] and held["shape"] == [4, 7], err[-3000:]


def test_openpi_client_without_or_with_a_wrong_key_is_refused_401(secured, key_dir, robot):
    before = _received(secured.handle.metrics)
    missing, wrong, altered = robot(secured.openpi_url, [
        {"api_key": None}, {"api_key": "not-a-token"}, {"api_key": token(key_dir, "robot-a") + "x"}])
    for r in (missing, wrong, altered):
        assert not r["ok"] and r["error_type"] == "InvalidStatus" and r["status"] == 401, r
        assert r["body"].count("\n") == 1 and "Traceback" not in r["body"], r["body"]
    assert "Authorization" in missing["body"] and "unknown" in wrong["body"]
    # nothing reached the scheduler
    assert _received(secured.handle.metrics) == before
    stats = secured.admin.stats()
    assert stats["groups_in_flight"] == 0 and not any(t["in_flight"] for t in stats["tenants"].values())
    # a bearer header works too, and /healthz needs no token
    with websockets.sync.client.connect(secured.openpi_url, compression=None, max_size=None, additional_headers={
            "Authorization": f"Bearer {token(key_dir, 'web-c')}"}, ssl=client_context()) as ws:
        meta = msgpack_numpy.unpackb(ws.recv(timeout=10))
        assert meta["scheduler"]["reachable"] is True
        ws.send(msgpack_numpy.packb({"observation/image": synthetic_image(), "seed": 1, "sampling": {"steps": 2}}))
        reply = msgpack_numpy.unpackb(ws.recv(timeout=30))
        assert reply["candidate_seeds"] == [1], reply
    with urllib.request.urlopen(secured.openpi_url.replace("wss://", "https://") + "/healthz", timeout=5,
                                context=client_context()) as r:
        assert r.status == 200


def test_over_tls_the_front_speaks_nothing_in_the_clear_and_robots_check_its_certificate(secured, key_dir, robot):
    """A robot sending its token in the clear to the TLS port gets no answer; one that does not trust the
    certificate refuses it before sending the token."""
    before = _received(secured.handle.metrics)
    with pytest.raises((websockets.exceptions.InvalidMessage, websockets.exceptions.InvalidHandshake, OSError)):
        websockets.sync.client.connect(secured.openpi_url.replace("wss://", "ws://"), open_timeout=10,
                                       additional_headers={"Authorization": f"Bearer {token(key_dir, 'web-c')}"})
    [untrusted] = robot(secured.openpi_url, [{"api_key": token(key_dir, "robot-a")}], trusts_the_certificate=False)
    assert not untrusted["ok"] and untrusted["error_type"] == "SSLCertVerificationError", untrusted
    assert _received(secured.handle.metrics) == before


def test_standalone_front_with_tokens_in_front_of_a_keyless_scheduler(fake_scheduler, key_dir, tmp_path):
    """`--tokens` on loopback: required there too; without scheduler keys the groups are the front's own
    (a keyless scheduler knows no principals to act for)."""
    cmd = [sys.executable, "-m", "candidate_scheduler.service.openpi", "--scheduler-request",
           fake_scheduler.request_endpoint, "--port", "0", "--tokens", str(key_dir)]
    front = ChildProcess(cmd, tmp_path / "front.log", env=ENV, cwd=ROOT)
    try:
        url = front.wait_line(READY, 30).group(1)
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            websockets.sync.client.connect(url, compression=None, open_timeout=10)
        assert refused.value.response.status_code == 401
        assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
        mark = fake_scheduler.mark()
        with websockets.sync.client.connect(url, compression=None, max_size=None, additional_headers={
                "Authorization": f"Api-Key {token(key_dir, 'robot-a')}"}) as ws:
            ws.recv(timeout=10)
            ws.send(msgpack_numpy.packb({"observation/image": synthetic_image(), "seed": 2}))
            assert "actions" in msgpack_numpy.unpackb(ws.recv(timeout=30))
        [sent] = fake_scheduler.since(mark)
        assert sent.on_behalf is None
    finally:
        front.stop()


def test_tokens_off_loopback_without_tls_say_they_travel_in_the_clear(fake_scheduler, key_dir, tmp_path):
    """Off loopback, a front taking tokens without TLS starts with a note naming the fix; with TLS, none."""
    for tls in ([], ["--tls-cert", CERT, "--tls-key", KEY]):
        front = ChildProcess([sys.executable, "-m", "candidate_scheduler.service.openpi", "--scheduler-request",
                              fake_scheduler.request_endpoint, "--bind", "0.0.0.0", "--port", "0", "--tokens",
                              str(key_dir), *tls], tmp_path / f"front{len(tls)}.log", env=ENV, cwd=ROOT)
        try:
            url = front.wait_line(re.compile(r"openpi front: listening on (wss?://\S+)"), 30).group(1)
            notes = [line for line in front.lines if "in the clear" in line]
            if tls:
                assert url.startswith("wss://") and notes == [], front.lines
            else:
                assert url.startswith("ws://") and len(notes) == 1 and "--tls-cert FILE --tls-key FILE" in notes[0]
        finally:
            front.stop()


# ---- sglang's HTTP server -----------------------------------------------------------------------------------


def _http(url: str, body: dict | None = None, auth: str | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=client_context()) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def http_with_tokens(fake_bridge, compat_model_dir, key_dir, tmp_path_factory):
    """`candidate-scheduler http --tokens DIR` over TLS (`--tls-cert`, `--tls-key`) on the fake scheduler's
    bridge; yields (base url, process).
    Port+1 is taken while it starts: sglang's offline broker would bind it, die, and leave /health at
    503 for good (a CI run lost 180 s to that)."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("http-tokens") / "http.log"
    cmd = [sys.executable, "-m", "candidate_scheduler.cli", "http", "--compat-port", str(fake_bridge.port),
           "--model", str(compat_model_dir), "--http-port", str(port), "--tokens", str(key_dir),
           "--tls-cert", CERT, "--tls-key", KEY]
    neighbour = socket.socket()
    neighbour.bind(("127.0.0.1", port + 1))
    neighbour.listen()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)
    base = f"https://127.0.0.1:{port}"
    try:
        def healthy():
            if proc.poll() is not None:
                raise RuntimeError(f"http exited ({proc.returncode}): {log_path.read_text()[-3000:]}")
            try:
                return _http(f"{base}/health", timeout=2)[0] == 200  # open without a token
            except OSError:
                return False

        wait_for(healthy, 180, f"the http server (log {log_path})", interval_s=0.25)
        yield base, proc
    finally:
        neighbour.close()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_sglang_http_listens_on_its_http_port_only(http_with_tokens):
    """sglang's offline broker (pickle.loads of whatever reaches port+1) does not run in our front."""
    import psutil

    base, proc = http_with_tokens
    port = int(base.rsplit(":", 1)[1])
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(proc.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {("127.0.0.1", port)}, listening


def test_sglang_http_needs_a_bearer_token(http_with_tokens, fake_compat, key_dir):
    from .test_http_server import _body, _image

    base, _ = http_with_tokens
    url = f"{base}/v1/actions/generations"
    fake = fake_compat.fake
    mark = fake.mark()
    for auth in (None, "Bearer not-a-token", f"Basic {token(key_dir, 'web-c')}"):
        status, resp = _http(url, _body(_image(41), "pick", 5, "tok-bad"), auth)
        assert status == 401 and resp["detail"].startswith("unauthorized"), (auth, status, resp)
    assert _http(f"{base}/v1/actions/metadata")[0] == 401
    assert _http(f"{base}/liveness")[0] == 200
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:  # the action websocket's handshake too
        websockets.sync.client.connect(base.replace("https://", "wss://") + "/v1/actions/realtime",
                                       open_timeout=10, ssl=client_context())
    assert refused.value.response.status_code == 401
    assert fake.since(mark) == []  # nothing reached the scheduler
    status, resp = _http(url, _body(_image(41), "pick", 5, "tok-ok"), f"Bearer {token(key_dir, 'web-c')}")
    assert status == 200 and resp["data"][0]["action"]["shape"] == [4, 7], resp
    status, _ = _http(f"{base}/v1/actions/metadata", auth=f"Api-Key {token(key_dir, 'robot-a')}")
    assert status == 200


def test_sglang_http_over_tls_answers_nothing_in_the_clear(http_with_tokens, fake_compat, key_dir):
    from .test_http_server import _body, _image

    base, _ = http_with_tokens
    mark = fake_compat.fake.mark()
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        _http(base.replace("https://", "http://") + "/v1/actions/generations", _body(_image(41), "pick", 5, "clear"),
              f"Bearer {token(key_dir, 'web-c')}", timeout=10)
    assert fake_compat.fake.since(mark) == []


# ---- refusals: a non-loopback bind without tokens -----------------------------------------------------------


def test_non_loopback_without_tokens_is_refused_in_one_line(fake_scheduler, key_dir):
    run = lambda *argv: subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=ENV,  # noqa: E731
                                       cwd=ROOT, timeout=60)
    front = _one_line_refusal(run("-m", "candidate_scheduler.service.openpi", "--scheduler-request",
                                  fake_scheduler.request_endpoint, "--bind", "0.0.0.0", "--port", "0"))
    assert "--tokens DIR" in front and "--insecure" in front
    http = _one_line_refusal(run("-m", "candidate_scheduler.cli", "http", "--http-host", "0.0.0.0"))
    assert "--tokens DIR" in http and "--insecure" in http
    serve = _one_line_refusal(run("-m", "candidate_scheduler.cli", "serve", "--request-port", "0", "--control-port",
                                  "0", "--worker-port", "0", "--metrics-port", "-1", "--no-compat",
                                  "--openpi-port", "0", "--openpi-host", "0.0.0.0"))
    assert "--openpi-tokens DIR" in serve and "--insecure" in serve
    missing = _one_line_refusal(run("-m", "candidate_scheduler.service.openpi", "--scheduler-request",
                                    fake_scheduler.request_endpoint, "--port", "0", "--tokens", str(key_dir / "nope")))
    assert "no such directory" in missing


def test_insecure_non_loopback_front_starts_with_a_warning(fake_scheduler, tmp_path):
    front = ChildProcess([sys.executable, "-m", "candidate_scheduler.service.openpi", "--scheduler-request",
                          fake_scheduler.request_endpoint, "--bind", "0.0.0.0", "--port", "0", "--insecure"],
                         tmp_path / "front.log", env=ENV, cwd=ROOT)
    try:
        url = front.wait_line(READY, 30).group(1)
        assert any("WARNING" in line and "WITHOUT tokens" in line for line in front.lines)
        port = int(url.rsplit(":", 1)[1])
        with websockets.sync.client.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
            assert "action_shape" in msgpack_numpy.unpackb(ws.recv(timeout=10))
    finally:
        front.stop()
