"""Multi-host, for real: the scheduler, a worker and the clients in three network namespaces joined by
veth pairs (tests/netns.py), so every connection crosses a non-loopback link. With a key directory, a
keyed worker, keyed native clients, openpi's own client with a token and sglang's HTTP API with a token
(through the compat bridge) work across them; a keyless client, a client with an unauthorised key, a
wrong token and a tampered frame are refused and admit nothing; one client can neither cancel
another's group nor drain or shut the scheduler down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from candidate_scheduler.service.keys import add_key, add_token, init_dir, read_token
from candidate_scheduler.service.launcher import Launcher
from tests.conftest import ENV, MODEL_DIR
from tests.netns import Hosts, NamespacesUnavailable

HERE = Path(__file__).resolve().parent
OPENPI_PORT = 8000  # fixed: the scheduler's namespace is new, so nothing else listens there
HTTP_PORT = 30000
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    try:
        h = Hosts(tmp_path_factory.mktemp("hosts"), ("worker", "client"))
    except (NamespacesUnavailable, FileNotFoundError) as exc:
        pytest.skip(f"network namespaces are not permitted here (CI runs as root): {exc}")
    yield h
    h.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    init_dir(d)
    add_key(d, "robot-a", "client", "robots")
    add_key(d, "robot-b", "client", "robots")
    add_token(d, "arm-1", "client", "robots")
    add_token(d, "web-user", "client", "default")
    return d


@pytest.fixture(scope="module")
def remote(hosts, keys, tmp_path_factory):
    """The scheduler on every interface of its host with the key directory, and a keyed null worker on
    the worker host; yields (scheduler handle, run(scenario) -> what the client host saw)."""
    logs = tmp_path_factory.mktemp("multihost")
    on_scheduler = Launcher(logs / "scheduler", python=hosts.python("scheduler"), env=ENV, model=MODEL_DIR)
    on_worker = Launcher(logs / "worker", python=hosts.python("worker"), env=ENV)
    try:
        sched = on_scheduler.scheduler("--host", "0.0.0.0", "--curve-dir", str(keys), "--heartbeat-timeout", "5",
                                       "--openpi-port", str(OPENPI_PORT), "--compat-host", "127.0.0.1", compat=True)
        # sglang's HTTP server beside the bridge, open to other hosts with tokens
        on_scheduler.start([hosts.python("scheduler"), "-m", "candidate_scheduler.cli", "http", "--compat-port",
                            sched.compat.rsplit(":", 1)[1], "--model", str(MODEL_DIR), "--http-host", "0.0.0.0",
                            "--http-port", str(HTTP_PORT), "--tokens", str(keys)], "http")
        worker_keys = logs / "worker-keys"  # what the worker host is given: the server's public key, its pair
        worker_keys.mkdir()
        for name in ("server.key", "worker.key_secret"):
            (worker_keys / name).write_bytes((keys / name).read_bytes())
        on_worker.worker(type("H", (), {"worker": hosts.scheduler_seen_from("worker", sched.worker), "workers": []}),
                         "null", 8, "--curve-dir", str(worker_keys), step_delay=0.02)
        job_dir = logs / "jobs"
        job_dir.mkdir()

        def run(scenario: str, timeout_s: float = 120) -> dict:
            job = job_dir / f"{scenario}.json"
            job.write_text(json.dumps({"scenario": scenario, "keys_dir": str(keys),
                                       "request": hosts.scheduler_seen_from("client", sched.request),
                                       "control": hosts.scheduler_seen_from("client", sched.control),
                                       "http": f"http://{hosts.addresses['scheduler@client']}:{HTTP_PORT}",
                                       "token": read_token(keys / "web-user.token")}))
            out = subprocess.run([hosts.python("client"), str(HERE / "remote_client.py"), str(job)], env=ENV,
                                 cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
            assert out.returncode == 0, out.stderr[-3000:]
            return json.loads(out.stdout.strip().splitlines()[-1])

        yield sched, run
    finally:
        on_worker.close()
        on_scheduler.close()


def test_keyed_worker_and_clients_work_across_hosts_and_rights_hold(remote):
    _sched, run = remote
    seen = run("keyed")
    assert seen["workers"] == 1  # the worker on its own host registered with its key
    assert seen["a_group"] == "done" and seen["b_own_group"] == "done"
    assert seen["b_own_namespace"] == ["unknown", "unknown"]
    assert seen["b_cancels_a"] == [False, "forbidden"] and seen["b_status_of_a"] == "forbidden"
    assert seen["b_shutdown"] == "forbidden" and seen["b_drain"] == "forbidden" and seen["b_stats"] == "forbidden"
    assert seen["b_worker_leave"] == "forbidden"
    assert seen["a_status_after"] == "done" and seen["admin_status_of_a"] == "done"
    assert seen["admin_status_own_namespace"] == "unknown"
    assert seen["admin_stats_security"]["curve"] is True and not seen["admin_stats_security"]["insecure"]


def test_keyless_and_unauthorised_clients_are_refused_and_admit_nothing(remote):
    _sched, run = remote
    seen = run("refused")
    assert seen["keyless"] == "no reply" and seen["wrong_key"] == "no reply"
    assert seen["in_flight_after"] == 0


def test_a_tampered_frame_is_refused_and_admits_nothing(remote):
    _sched, run = remote
    seen = run("tampered")
    assert seen["tampered_chunks"] == 1
    assert seen["reply"] == "no reply" and seen["admitted"] == "unknown"
    assert seen["untampered_after"] == "done"


def test_the_scheduler_listens_off_loopback_only_on_its_own_host(remote, hosts):
    sched, _run = remote
    assert sched.request.startswith("tcp://0.0.0.0:")
    # the host running the tests cannot reach it: traffic stays between the namespaces the test made
    probe = subprocess.run([sys.executable, "-c", "import socket,sys; s=socket.socket(); s.settimeout(1); "
                            f"sys.exit(s.connect_ex(('{hosts.addresses['scheduler@client']}', "
                            f"{sched.request.rsplit(':', 1)[1]})) == 0)"], capture_output=True, timeout=10)
    assert probe.returncode == 0


def test_openpi_client_with_a_token_across_hosts_and_without_one_refused(remote, hosts, keys, tmp_path):
    from tests.compat import openpi_client_env
    from tests.compat.test_front_tokens import ROBOT

    robot = tmp_path / "robot.py"
    robot.write_text(ROBOT)
    job = tmp_path / "attempts.json"
    job.write_text(json.dumps([{"api_key": read_token(keys / "arm-1.token"), "steps": 4},
                               {"api_key": None, "steps": 4}, {"api_key": "wrong", "steps": 4}]))
    python = hosts.python("client", str(openpi_client_env.client_python()))
    url = f"ws://{hosts.addresses['scheduler@client']}:{OPENPI_PORT}"
    out = subprocess.run([python, str(robot), url, str(job)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    token, none, wrong = (json.loads(line) for line in out.stdout.strip().splitlines())
    assert token["ok"] and token["shape"][0] == 4, token
    assert not none["ok"] and none["status"] == 401, none
    assert not wrong["ok"] and wrong["status"] == 401, wrong


def test_sglang_http_with_a_token_across_hosts_through_the_bridge(remote):
    _sched, run = remote
    seen = run("http", timeout_s=300)
    assert seen == {"no_token": 401, "wrong_token": 401, "token": 200}, seen
