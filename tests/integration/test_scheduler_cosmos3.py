"""The scheduler with real Cosmos3 workers (sglang's model code on the tiny checkpoint): results
through the whole service equal sglang's own pipeline, whatever the split or the faults."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from candidate_scheduler.core import rng
from candidate_scheduler.core.reducers import reduce
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.client import make_request, synthetic_image
from tests.conftest import hold_the_worker, wait_for

pytestmark = pytest.mark.sglang

IMAGE = synthetic_image(64, 64, seed=12)
PROMPT = "put the cup in the sink"
SAMPLING = SamplingSpec()


def references(reference, seed: int, count: int, policy: str = "per_candidate") -> np.ndarray:
    return np.stack([reference(IMAGE, PROMPT, SAMPLING, s) for s in rng.candidate_seeds(seed, count, policy)])


def test_count_one_through_the_service_is_sglangs_output(service):
    with service.handle.client() as c:
        r = c.submit(IMAGE, PROMPT, count=1, seed=123, timeout_s=60)
    assert r.status == "done", r.error
    want = service.reference(IMAGE, PROMPT, SAMPLING, 123)
    assert r.action.tobytes() == want.tobytes()  # mean of one candidate is that candidate, bitwise


def test_microbatched_on_capacity_4_equals_atomic_on_capacity_8_and_sglang(services, sglang_reference):
    small = services.scheduler()
    services.worker(small, "cosmos3", 4)
    big = services.scheduler()
    services.worker(big, "cosmos3", 8)
    small.wait_workers(1, timeout_s=180)
    big.wait_workers(1, timeout_s=180)
    with small.client() as a, big.client() as b:
        split = a.submit(IMAGE, PROMPT, count=8, seed=2024, return_candidates=True, timeout_s=60)
        whole = b.submit(IMAGE, PROMPT, count=8, seed=2024, return_candidates=True, timeout_s=60)
    assert (split.metrics["admission_mode"], split.metrics["microbatches"]) == ("microbatch", 2)
    assert whole.metrics["admission_mode"] == "atomic"
    assert split.candidates.tobytes() == whole.candidates.tobytes()
    assert split.action.tobytes() == whole.action.tobytes()
    want = references(sglang_reference, 2024, 8)
    assert split.candidates.tobytes() == want.tobytes()
    assert split.action.tobytes() == reduce("mean", want).tobytes()
    # one transformer forward per step per physical batch, not per candidate
    assert whole.metrics["physical_forwards"] == SAMPLING.steps
    assert split.metrics["physical_forwards"] == 2 * SAMPLING.steps


@pytest.mark.parametrize("conditioning", ["thread", "inline"])
def test_a_joiner_conditioned_beside_the_running_batch_equals_sglang(services, sglang_reference, conditioning):
    """Step batching: a group with a new observation and a new prompt joins a running group. With the
    conditioning thread its VAE encode and text pathway run while the running group keeps stepping;
    inline they run between two steps. Either way both groups are bitwise sglang's own pipeline."""
    sched = services.scheduler("--batching", "step")
    services.worker(sched, "cosmos3", 8, 0.0, "--conditioning", conditioning)
    sched.wait_workers(1, timeout_s=180)
    long_sampling, other, prompt = SamplingSpec(steps=80), synthetic_image(64, 64, seed=77), "stack the blocks"
    with sched.client() as c:
        long_id = c.send(make_request(IMAGE, PROMPT, count=2, seed=5, steps=80, return_candidates=True))
        wait_for(lambda: c.status(long_id).state == "running", 30, "the long group to run")
        joiner = c.submit(other, prompt, count=2, seed=9, return_candidates=True, timeout_s=60)
        long = c.wait(long_id, timeout_s=60)
    assert joiner.status == "done" and long.status == "done"
    assert joiner.metrics["joined_running_batches"] == 1
    if conditioning == "thread":
        assert joiner.metrics["steps_while_conditioned"] > 0  # the long group stepped meanwhile
    else:
        assert joiner.metrics["steps_while_conditioned"] == 0
    want_long = np.stack([sglang_reference(IMAGE, PROMPT, long_sampling, s) for s in rng.candidate_seeds(5, 2)])
    want_joiner = np.stack([sglang_reference(other, prompt, SAMPLING, s) for s in rng.candidate_seeds(9, 2)])
    assert long.candidates.tobytes() == want_long.tobytes()
    assert joiner.candidates.tobytes() == want_joiner.tobytes()


def test_sigkill_mid_group_on_cosmos3_equals_the_fault_free_result(services, sglang_reference):
    sched = services.scheduler()
    victim = services.worker(sched, "cosmos3", 4, 0.3)
    services.worker(sched, "cosmos3", 4, 0.3)
    sched.wait_workers(2, timeout_s=180)
    with sched.client() as c:
        rid = c.send(make_request(IMAGE, PROMPT, count=8, seed=99, return_candidates=True))
        victim_id = None

        def victim_mid_denoise():
            for wid, w in c.stats()["workers"].items():
                if str(victim.pid) in wid and w["step"] is not None and w["step"] >= 1:
                    return wid
            return None

        victim_id = wait_for(victim_mid_denoise, 30, "the victim worker mid-denoise")
        os.kill(victim.pid, signal.SIGKILL)
        r = c.wait(rid, timeout_s=60)
    assert victim_id
    assert r.status == "done", r.error
    assert r.metrics["retries"] == 1
    want = references(sglang_reference, 99, 8)
    assert r.candidates.tobytes() == want.tobytes()
    assert r.action.tobytes() == reduce("mean", want).tobytes()


def test_co_batched_groups_equal_their_references(service):
    with service.handle.client() as c:
        held = hold_the_worker(c, IMAGE, PROMPT, steps=100)
        a = c.send(make_request(IMAGE, PROMPT, count=3, seed=31, return_candidates=True, request_id="co-A"))
        b = c.send(make_request(IMAGE, PROMPT, count=4, seed=57, return_candidates=True, request_id="co-B"))
        ra, rb = c.wait(a, timeout_s=60), c.wait(b, timeout_s=60)
        assert all(c.wait(rid, timeout_s=60).status == "done" for rid in held)
    assert ra.metrics["co_batched_batches"] == 1 and rb.metrics["co_batched_batches"] == 1
    assert ra.candidates.tobytes() == references(service.reference, 31, 3).tobytes()
    assert rb.candidates.tobytes() == references(service.reference, 57, 4).tobytes()


def test_a_request_the_model_cannot_serve_fails_once_without_retries(service):
    with service.handle.client() as c:
        r = c.submit(IMAGE, PROMPT, count=2, raw_action_dim=5, timeout_s=60)
        ok = c.submit(IMAGE, PROMPT, count=2, timeout_s=60)
    assert r.status == "failed" and r.error_code == "bad_raw_action_dim" and "7" in r.error
    assert r.metrics["retries"] == 0 and r.action is None
    assert ok.status == "done"


def test_an_exception_inside_the_model_is_a_model_error_answered_once_without_retries(service):
    # sglang's own UniPC asserts past ~110 steps on the tiny checkpoint (its pipeline fails the same way)
    with service.handle.client() as c:
        r = c.submit(IMAGE, PROMPT, count=2, seed=1, steps=120, timeout_s=120)
        after = c.submit(IMAGE, PROMPT, count=1, seed=123, timeout_s=60)
    assert r.status == "failed" and r.error_code == "model_error"
    assert r.error.startswith("AssertionError: ") and "raised at " in r.error and ".py:" in r.error
    assert r.metrics["retries"] == 0 and r.metrics["slice_attempts"] == 1
    assert after.status == "done"  # the worker keeps serving
