"""Multi-host, for real: the scheduler, a worker and the clients in three network namespaces joined by
veth pairs (tests/netns.py), so every connection crosses a non-loopback link. With a key directory, a
keyed worker and keyed clients work across them; a keyless client, a client with an unauthorised key
and a tampered frame are refused and admit nothing; one client can neither cancel another's group nor
drain or shut the scheduler down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ENV, MODEL_DIR
from tests.netns import Hosts, NamespacesUnavailable

from candidate_scheduler.service.keys import add_key, init_dir
from candidate_scheduler.service.launcher import Launcher

HERE = Path(__file__).resolve().parent
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
    return d


@pytest.fixture(scope="module")
def remote(hosts, keys, tmp_path_factory):
    """The scheduler on every interface of its host with the key directory, and a keyed null worker on
    the worker host; yields (scheduler handle, run(scenario) -> what the client host saw)."""
    logs = tmp_path_factory.mktemp("multihost")
    on_scheduler = Launcher(logs / "scheduler", python=hosts.python("scheduler"), env=ENV, model=MODEL_DIR)
    on_worker = Launcher(logs / "worker", python=hosts.python("worker"), env=ENV)
    try:
        sched = on_scheduler.scheduler("--host", "0.0.0.0", "--curve-dir", str(keys), "--heartbeat-timeout", "5")
        worker_keys = logs / "worker-keys"  # what the worker host is given: the server's public key, its pair
        worker_keys.mkdir()
        for name in ("server.key", "client.key_secret"):
            (worker_keys / name).write_bytes((keys / name).read_bytes())
        on_worker.worker(type("H", (), {"worker": hosts.scheduler_seen_from("worker", sched.worker), "workers": []}),
                         "null", 8, "--curve-dir", str(worker_keys), step_delay=0.02)
        job_dir = logs / "jobs"
        job_dir.mkdir()

        def run(scenario: str, timeout_s: float = 120) -> dict:
            job = job_dir / f"{scenario}.json"
            job.write_text(json.dumps({"scenario": scenario, "keys_dir": str(keys),
                                       "request": hosts.scheduler_seen_from("client", sched.request),
                                       "control": hosts.scheduler_seen_from("client", sched.control)}))
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
    assert seen["b_cancels_a"] == [False, "forbidden"] and seen["b_status_of_a"] == "forbidden"
    assert seen["b_shutdown"] == "forbidden" and seen["b_drain"] == "forbidden" and seen["b_stats"] == "forbidden"
    assert seen["a_status_after"] == "done" and seen["admin_status_of_a"] == "done"
    assert seen["admin_stats_security"]["curve"] is True and not seen["admin_stats_security"]["insecure"]


def test_keyless_and_unauthorised_clients_are_refused_and_admit_nothing(remote):
    _sched, run = remote
    seen = run("refused")
    assert seen["keyless"] == "no reply" and seen["wrong_key"] == "no reply"
    assert seen["admitted"] == ["unknown", "unknown"]


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
