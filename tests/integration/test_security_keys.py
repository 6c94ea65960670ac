"""The key directory at the edges: one-line refusals at start, --insecure shown in stats, ZAP domains
(a worker key is nobody on the client sockets, a client key nobody on the worker link), and who may
submit on behalf of whom (only a proxy, only for a client holding a token)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from candidate_scheduler.service.client import Client, SchedulerUnavailable, make_request, synthetic_image
from candidate_scheduler.service.keys import ClientKeys, add_key, add_token, init_dir
from tests.conftest import ENV, ROOT, wait_for

IMAGE = synthetic_image()
CLI = [sys.executable, "-m", "candidate_scheduler.cli"]
PORTS = ["--request-port", "0", "--control-port", "0", "--worker-port", "0", "--metrics-port", "-1"]


def _refused(*args: str) -> str:
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_dir(d)
    add_key(d, "robot", "client", "robots")
    add_key(d, "front", "proxy", "default")
    add_token(d, "arm", "client", "robots")
    return d


def test_every_refusal_at_start_is_one_line_with_the_fix(tmp_path):
    line = _refused("serve", "--host", "0.0.0.0", *PORTS, "--no-compat")
    assert "request, control and worker sockets" in line and "--curve-dir" in line and "--insecure" in line
    line = _refused("serve", *PORTS, "--compat-host", "0.0.0.0", "--compat-port", "0")
    assert "compat" in line and "pickle" in line
    bad = tmp_path / "bad"
    init_dir(bad)
    (bad / "authorized_tokens").mkdir()
    (bad / "authorized_tokens" / "x.json").write_text("[]")
    line = _refused("serve", *PORTS, "--no-compat", "--curve-dir", str(bad))
    assert "x.json" in line and "not a JSON object" in line
    line = _refused("serve", *PORTS, "--no-compat", "--curve-dir", str(tmp_path / "missing"))
    assert "key directory" in line


def test_zap_domains_keep_workers_and_clients_on_their_own_sockets(services, keys):
    sched = services.scheduler("--curve-dir", str(keys))
    worker_as_client = Client(sched.request, sched.control, timeout_s=2, keys=ClientKeys.load(keys, "worker"))
    # a worker's key is refused at the handshake on the client sockets: the send either queues and the
    # reply never comes, or (once ZMQ has dropped the refused pipe) finds no peer to queue for
    with pytest.raises((TimeoutError, SchedulerUnavailable)):
        worker_as_client.submit(IMAGE, "pick", timeout_s=2)
    worker_as_client.close()
    robot_dir = Path(services.tmp_path) / "robot-as-worker"
    robot_dir.mkdir()
    (robot_dir / "server.key").write_bytes((keys / "server.key").read_bytes())
    (robot_dir / "worker.key_secret").write_bytes((keys / "robot.key_secret").read_bytes())
    services.worker(sched, "null", 8, 0.0, "--curve-dir", str(robot_dir))
    time.sleep(2.0)  # nothing to wait for: a client's key must not register a worker
    with sched.client() as admin:
        stats = admin.stats()
        assert stats["workers"] == {} and stats["groups_in_flight"] == 0  # the refused submit admitted nothing
        assert stats["security"] == {"curve": True, "insecure": False, "insecure_sockets": [],
                                             "unkeyed_local": [], "asked_by": "admin"}


def test_only_a_proxy_acts_for_another_and_only_for_a_token_holder(services, keys):
    sched = services.scheduler("--curve-dir", str(keys))
    services.worker(sched, "null", 8, 0.05, "--curve-dir", str(keys))  # 200 steps: 10 s in flight
    sched.wait_workers(1)
    with Client(sched.request, sched.control, keys=ClientKeys.load(keys, "robot"), timeout_s=20) as robot, \
            Client(sched.request, sched.control, keys=ClientKeys.load(keys, "front"), timeout_s=20) as front:
        r = robot.wait(robot.send(make_request(IMAGE, "pick", on_behalf="arm")))
        assert (r.status, r.error_code) == ("rejected", "forbidden") and "on behalf" in r.error
        for target in ("admin", "robot", "nobody"):  # not token holders: a proxy key cannot charge them
            r = front.wait(front.send(make_request(IMAGE, "pick", on_behalf=target)))
            assert (r.status, r.error_code) == ("rejected", "forbidden"), target
        rid = front.send(make_request(IMAGE, "pick", on_behalf="arm", steps=200))
        wait_for(lambda: front.status(rid).state in ("admitted", "running"), 10, "the proxy's group in flight")
        with sched.client() as admin:
            tenants = admin.stats()["tenants"]
        assert tenants.get("robots", {}).get("in_flight") == 1, tenants
        assert front.cancel(rid).changed  # the proxy's own group, sent for "arm"
        assert front.wait(rid).status == "cancelled"


def test_insecure_is_said_out_loud_and_shown_in_stats(tmp_path):
    from candidate_scheduler.service.launcher import Launcher
    from tests.netns import Hosts, NamespacesUnavailable

    try:
        hosts = Hosts(tmp_path, ())  # a namespace of its own: 0.0.0.0 there reaches nothing else
    except (NamespacesUnavailable, FileNotFoundError) as exc:
        pytest.skip(f"network namespaces are not permitted here (CI runs as root): {exc}")
    try:
        with Launcher(tmp_path / "logs", python=hosts.python("scheduler"), env=ENV) as launcher:
            sched = launcher.scheduler("--host", "0.0.0.0", "--insecure")
            time.sleep(0.2)
            assert any("WARNING: --insecure" in line for line in sched.proc.lines)
            probe = subprocess.run([hosts.python("scheduler"), "-c", (
                "import json, sys; from candidate_scheduler.service.client import Client; "
                f"c = Client('tcp://127.0.0.1:{sched.control.rsplit(':', 1)[1]}', "
                f"'tcp://127.0.0.1:{sched.control.rsplit(':', 1)[1]}'); print(json.dumps(c.stats()['security']))")],
                capture_output=True, text=True, timeout=30, env=ENV, cwd=ROOT)
            assert probe.returncode == 0, probe.stderr[-2000:]
            security = __import__("json").loads(probe.stdout.strip().splitlines()[-1])
            assert security["insecure"] is True and security["curve"] is False
            assert set(security["insecure_sockets"]) == {"request", "control", "worker"}
    finally:
        hosts.close()
