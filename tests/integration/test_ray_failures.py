"""The service on Ray when a part of it fails (service/ray_placement.py), on a real local cluster:

- the service process an actor runs (its child: `serve` or `worker`) dies on its own (a crash, the OOM
  killer) while the actor lives on: the actor goes with it, so Ray restarts it and the service comes back
  (before, the actor sat there holding its bundle and nobody restarted anything);
- a start that fails (a scheduler that does not come up) gives back what it reserved: the placement
  group and the actors, so a second try is not starved of the first one's CPUs and GPUs;
- Ctrl-C on `up --ray` while it waits for workers that never register stops it at once, not after the
  five minutes the wait allows; so does a worker dead for good (exit 1).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from candidate_scheduler.service.launcher import child_env
from candidate_scheduler.service.processes import ChildProcess
from candidate_scheduler.service.requests import make_request
from tests.conftest import ROOT, free_port, wait_for
from tests.integration.test_scheduler import IMAGE

ray = pytest.importorskip("ray", reason="Ray is in requirements/lock.txt; `pip install candidate-scheduler[ray]`")
from candidate_scheduler.service import ray_placement  # noqa: E402 - needs ray

NULL_WORKER = ("--adapter", "null", "--capacity", "8", "--warmup-shapes", "")
SERVE = ("--no-compat", "--metrics-port", "-1", "--heartbeat-timeout", "3")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=ray_placement.NAMESPACE)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _child_pid(actor) -> int | None:
    """The pid of the service process `actor` runs; None while the actor is being restarted."""
    try:
        return ray.get(actor.pid.remote(), timeout=5)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None


def _live_groups() -> list[str]:
    return [g["state"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


def test_an_actor_whose_service_process_dies_is_restarted_and_serves_again(cluster, tmp_path):
    svc = ray_placement.start(1, worker_args=NULL_WORKER, serve_args=SERVE, cpus_per_worker=0.5, free_ports=True,
                              name="ray-child-dies", log_dir=str(tmp_path))
    try:
        svc.wait_workers(timeout_s=60)
        for actor in (svc.workers[0], svc.scheduler):
            victim = _child_pid(actor)
            os.kill(victim, signal.SIGKILL)  # the child only: the actor's own process lives on
            wait_for(lambda a=actor, v=victim: _child_pid(a) not in (None, v), 60, "the actor restarted by Ray")
            svc.wait_workers(timeout_s=60)  # a worker came back, or came back to the scheduler that did
            with svc.client() as c:
                r = c.submit(IMAGE, "pick", count=2, seed=3, steps=4, timeout_s=60)
            assert r.status == "done"
    finally:
        svc.shutdown()
    wait_for(lambda: not _live_groups(), 20, "the placement group given back")


def test_a_scheduler_killed_by_ray_comes_back_with_its_compat_bridge_on_the_same_ports(cluster, tmp_path):
    """The bridge `serve` starts dies with it: left running, it held the compat port, and every restart of
    the scheduler actor failed on it (`up --ray` starts the bridge by default)."""
    svc = ray_placement.start(1, worker_args=NULL_WORKER, serve_args=("--metrics-port", "-1"), cpus_per_worker=0.5,
                              free_ports=True, name="ray-with-bridge", log_dir=str(tmp_path))
    try:
        svc.wait_workers(timeout_s=60)
        victim = _child_pid(svc.scheduler)
        ray.kill(svc.scheduler, no_restart=False)  # Ray restarts it, on the same ports
        wait_for(lambda: _child_pid(svc.scheduler) not in (None, victim), 90, "the scheduler restarted by Ray")
        assert ray.get(svc.scheduler.endpoints.remote(), timeout=10) == svc.endpoints  # the bridge's port too
        svc.wait_workers(timeout_s=60)
        with svc.client() as c:
            assert c.submit(IMAGE, "pick", count=2, seed=3, steps=4, timeout_s=60).status == "done"
    finally:
        svc.shutdown()
    wait_for(lambda: not _live_groups(), 20, "the placement group given back")


def test_a_start_that_fails_gives_back_its_placement_group_and_its_actors(cluster, tmp_path):
    assert not _live_groups()
    with pytest.raises(Exception):  # noqa: B017 - Ray's own error types: the scheduler actor died
        ray_placement.start(1, worker_args=NULL_WORKER, serve_args=(*SERVE, "--no-such-flag"), cpus_per_worker=0.5,
                            free_ports=True, name="ray-bad-start", log_dir=str(tmp_path), ready_timeout_s=60)
    wait_for(lambda: not _live_groups(), 20, "the placement group given back")
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= 2, 20, "every CPU free again")
    with pytest.raises(ValueError):  # the name is free for the next try
        ray.get_actor("ray-bad-start", namespace=ray_placement.NAMESPACE)


def test_ctrl_c_stops_up_while_it_waits_for_workers_that_never_register(cluster, tmp_path):
    # a worker flag its `worker` refuses: it exits at once, and never registers
    up = ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "up", "--ray", cluster, "--workers", "1",
                       "--cpus-per-worker", "0.5", "--adapter", "null", "--warmup-shapes", "bogus", "--no-compat",
                       "--metrics-port", "-1", "--request-port", str(free_port()), "--control-port", str(free_port()),
                       "--worker-port", str(free_port())], tmp_path / "up.log",
                      env=child_env(), cwd=ROOT)  # now: with what ray.init set (the cluster's auth mode)
    try:
        up.wait_line(re.compile("on Ray: scheduler actor"), 120)
        asked = time.monotonic()
        up.proc.send_signal(signal.SIGINT)
        up.proc.wait(timeout=30)
        assert time.monotonic() - asked < 30
    finally:
        up.kill()
    wait_for(lambda: not _live_groups(), 30, "up's placement group given back")


def test_up_stops_when_its_scheduler_actor_is_dead_for_good(cluster, tmp_path):
    """Past its restarts the scheduler actor stays dead: `up --ray` exits non-zero, so whoever runs it (systemd,
    a job) learns the service is gone, instead of holding on while nothing serves."""
    up = ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "up", "--ray", cluster, "--workers", "1",
                       "--cpus-per-worker", "0.5", "--adapter", "null", "--warmup-shapes", "", "--no-compat",
                       "--max-restarts", "0", "--metrics-port", "-1", "--request-port", str(free_port()),
                       "--control-port", str(free_port()), "--worker-port", str(free_port())], tmp_path / "up.log",
                      env=child_env(), cwd=ROOT)
    try:
        up.wait_line(re.compile("workers registered"), 120)
        ray.kill(ray.get_actor(ray_placement.DEFAULT_NAME, namespace=ray_placement.NAMESPACE), no_restart=True)
        assert up.proc.wait(timeout=30) == 1
        assert any("Ray will not restart it" in line for line in up.lines)
    finally:
        up.kill()
    wait_for(lambda: not _live_groups(), 30, "up's placement group given back")


def test_up_stops_when_a_worker_that_cannot_start_has_spent_its_restarts(cluster, tmp_path):
    """A worker that exits at start (a flag its `worker` refuses) spends its restarts in seconds; `up --ray`
    waited the whole five minutes for it to register, then ended in a traceback. Now: exit 1, naming it."""
    up = ChildProcess([sys.executable, "-m", "candidate_scheduler.cli", "up", "--ray", cluster, "--workers", "1",
                       "--cpus-per-worker", "0.5", "--adapter", "null", "--warmup-shapes", "bogus", "--no-compat",
                       "--max-restarts", "0", "--metrics-port", "-1", "--request-port", str(free_port()),
                       "--control-port", str(free_port()), "--worker-port", str(free_port())], tmp_path / "up.log",
                      env=child_env(), cwd=ROOT)
    try:
        up.wait_line(re.compile("on Ray: scheduler actor"), 120)
        assert up.proc.wait(timeout=60) == 1
        assert any("worker ray-worker-0: the actor died and Ray will not restart it" in line for line in up.lines)
    finally:
        up.kill()
    wait_for(lambda: not _live_groups(), 30, "up's placement group given back")


def test_shutdown_answers_the_groups_in_flight_before_the_scheduler_goes(cluster, tmp_path):
    """RayService.shutdown (Ctrl-C on `up --ray`) stops serve as SIGTERM does, while the workers still
    run: a group in flight is answered. Killed outright (as before), the group was never answered: its
    client learnt only from its liveness check that the scheduler was gone."""
    svc = ray_placement.start(1, worker_args=(*NULL_WORKER, "--step-delay", "0.05"), serve_args=SERVE,
                              cpus_per_worker=0.5, free_ports=True, name="ray-graceful", log_dir=str(tmp_path))
    try:
        svc.wait_workers()
        with svc.client(liveness_s=0.5) as c:
            rid = c.send(make_request(IMAGE, "pick", count=2, seed=3, steps=40, request_id="in-flight-at-stop"))
            wait_for(lambda: c.stats()["groups_in_flight"] == 1, 20, "the group in flight")
            began = time.monotonic()
            svc.shutdown(grace_s=20)
            took = time.monotonic() - began
            r = c.wait(rid, timeout_s=5)
        assert r.status == "done", r
        assert took < 20, took  # serve exited once its last group was answered, not at the end of the grace
    finally:
        svc.shutdown(grace_s=0)
