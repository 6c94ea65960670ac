"""The service on a real local Ray cluster (service/ray_placement.py): placement and registration; a
worker actor killed mid-group is restarted by Ray and the group's result equals the fault-free one
bitwise; the scheduler killed with groups in flight: every client learns it within the stated bound,
Ray restarts it on the same ports, and each group resubmitted gives exactly one result; and the GRPO
rollout example (examples/grpo_rollouts.py) on tiny Cosmos3 workers placed by Ray."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from candidate_scheduler.service.client import SchedulerUnavailable, make_request
from candidate_scheduler.service.launcher import child_env
from tests.conftest import MODEL_DIR, ROOT, wait_for
from tests.integration.test_scheduler import IMAGE, assert_single_reply, expected_candidates

ray = pytest.importorskip("ray", reason="Ray is in requirements/lock.txt; `pip install candidate-scheduler[ray]`")
from candidate_scheduler.service import ray_placement  # noqa: E402 - needs ray

LIVENESS_S = 0.5
NULL_WORKER = ("--adapter", "null", "--capacity", "8", "--warmup-shapes", "")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace=ray_placement.NAMESPACE)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _service(workers: int, step_delay: float, name: str, tmp_path):
    return ray_placement.start(
        workers, worker_args=(*NULL_WORKER, "--step-delay", str(step_delay)),
        serve_args=("--no-compat", "--metrics-port", "-1", "--heartbeat-timeout", "3"),
        cpus_per_worker=0.5, free_ports=True, name=name, log_dir=str(tmp_path))


def test_placed_workers_register_and_a_killed_one_is_restarted_with_its_group_bitwise(cluster, tmp_path):
    svc = _service(2, 0.05, "ray-restart", tmp_path)
    try:
        stats = svc.wait_workers()
        assert sorted(stats["workers"]) == ["ray-worker-0", "ray-worker-1"]
        table = ray.util.placement_group_table(svc.group)
        assert table["strategy"] == "SPREAD" and len(table["bundles"]) == 3 and table["state"] == "CREATED"
        with svc.client(liveness_s=LIVENESS_S) as c:
            rid = c.send(make_request(IMAGE, "pick", count=16, seed=21, steps=40, request_id="across-a-kill",
                                      return_candidates=True))  # 16 candidates: both workers run a slice
            wait_for(lambda: all(w["step"] for w in c.stats()["workers"].values()), 20, "both workers stepping")
            victim = ray.get(svc.workers[0].pid.remote())
            killed = time.monotonic()
            ray.kill(svc.workers[0], no_restart=False)  # Ray restarts it (max_restarts)
            r = c.wait(rid, timeout_s=60)
            finished_s = time.monotonic() - killed
        assert r.status == "done" and r.metrics["retries"] >= 1
        np.testing.assert_array_equal(r.candidates, expected_candidates(21, 16, steps=40))
        restarted = wait_for(lambda: ray.get(svc.workers[0].pid.remote()) != victim and
                             "ray-worker-0" in svc.wait_workers()["workers"], 30, "the restarted worker")
        assert restarted
        print(f"\nRay restart: a killed worker's group finished {finished_s:.2f} s after the kill "
              f"(40 steps of 0.05 s; the fault-free group takes ~2 s)")
    finally:
        svc.shutdown()


def test_a_killed_scheduler_is_seen_within_the_bound_restarted_by_ray_and_resubmissions_answer_once(cluster, tmp_path):
    svc = _service(1, 0.1, "ray-scheduler", tmp_path)
    try:
        svc.wait_workers()
        requests = [make_request(IMAGE, "pick", count=2, seed=50 + i, steps=40, request_id=f"ray-lost-{i}",
                                 return_candidates=True) for i in range(2)]
        seen: dict[str, float] = {}

        def waiter(req):
            with svc.client(liveness_s=LIVENESS_S) as c:
                c.send(req)
                try:
                    c.wait(req.request_id, timeout_s=60)
                except SchedulerUnavailable:
                    seen[req.request_id] = time.monotonic()

        threads = [threading.Thread(target=waiter, args=(r,)) for r in requests]
        for t in threads:
            t.start()
        with svc.client() as admin:
            wait_for(lambda: admin.stats()["groups_in_flight"] == 2, 20, "both groups in flight")
        killed = time.monotonic()
        ray.kill(svc.scheduler, no_restart=False)  # its serve child dies with it; Ray restarts the actor
        for t in threads:
            t.join(timeout=30)
        after = {rid: at - killed for rid, at in seen.items()}
        assert set(after) == {r.request_id for r in requests}
        bound = 2 * LIVENESS_S + 1.0  # silence, then an unanswered PING; the rest is slack for a busy host
        assert max(after.values()) <= bound, after
        svc.wait_workers(timeout_s=60)  # the same ports: the worker re-registered by itself
        with svc.client(liveness_s=LIVENESS_S) as c:
            results = [c.submit(IMAGE, "pick", count=2, seed=50 + i, steps=40, request_id=f"ray-lost-{i}",
                                return_candidates=True, resubmit=True, timeout_s=60) for i in range(2)]
            assert_single_reply(c, "ray-lost-0")
        for i, r in enumerate(results):
            assert r.status == "done"
            np.testing.assert_array_equal(r.candidates, expected_candidates(50 + i, 2, steps=40))
        print(f"\nscheduler killed: clients raised SchedulerUnavailable after "
              f"{', '.join(f'{v:.2f}' for v in sorted(after.values()))} s (liveness {LIVENESS_S} s)")
    finally:
        svc.shutdown()


@pytest.mark.sglang
def test_the_grpo_rollout_example_runs_on_cosmos3_workers_placed_by_ray(cluster):
    out = subprocess.run([sys.executable, "examples/grpo_rollouts.py", "--address", cluster, "--model", str(MODEL_DIR),
                          "--prompts", "2", "--group-size", "4", "--train-steps", "2", "--cpus-per-worker", "1"],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)  # Ray's auth mode too
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    steps = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("groups with identical candidates: 0" in s for s in steps), out.stdout
    assert "done: 2 steps, 0 collapsed group(s)" in out.stdout
