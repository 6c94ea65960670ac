"""RL rollouts on the Cosmos3 action branch: per-candidate trajectories and log-probs that never
collapse to candidate 0, exact sigmas, batched == sequential, caller-provided x_T.

Regression tests for the three seed-002 symptoms: (1) K copies of row 0's log-probs, (2) SDE noise
drawn with the full batch shape from every generator (batched != sequential), (3) sigmas rebuilt
from timesteps instead of the scheduler's own."""

from __future__ import annotations

import copy
import math
import os
import signal

import numpy as np
import pytest

from candidate_scheduler.core import rng
from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec
from candidate_scheduler.service.client import make_request, synthetic_image
from tests.conftest import hold_the_worker, wait_for

pytestmark = pytest.mark.sglang

IMAGE = synthetic_image(64, 64, seed=21)
PROMPT = "stack the blocks"
ROLL = SamplingSpec(rollout=True, noise_level=0.7)
FIELDS = ("log_probs", "latents", "next_latents", "means", "stds", "final_latents")


@pytest.fixture(scope="module")
def adapter(model_dir):
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    return Cosmos3CandidateAdapter(model_dir, device="cpu", max_candidates_per_batch=8)


def run(adapter, seeds, sampling=ROLL, noise=None, rid="r"):
    cands = [CandidateWork(i, s, None, None if noise is None else noise[i]) for i, s in enumerate(seeds)]
    outs, report = adapter.run_batch([GroupWork(rid, IMAGE, PROMPT, sampling, cands)])
    assert outs[0].status == "ok", outs[0].error
    return outs[0]


def test_every_candidate_has_its_own_log_prob_row(adapter):
    out = run(adapter, rng.candidate_seeds(5, 4, "per_candidate"))
    lp = out.rollout["log_probs"][:, 0]  # [K, S]
    assert lp.shape == (4, ROLL.steps) and np.all(np.isfinite(lp))
    for k in range(1, 4):
        assert not np.array_equal(lp[k], lp[0]), f"candidate {k} carries candidate 0's log-probs"
    assert len({out.rollout["final_latents"][k].tobytes() for k in range(4)}) == 4


def test_batched_rollout_equals_sequential_rollout(adapter):
    seeds = rng.candidate_seeds(77, 4, "per_candidate")
    batched = run(adapter, seeds)
    for k, seed in enumerate(seeds):
        alone = run(adapter, [seed])
        for name in FIELDS:
            assert alone.rollout[name][0].tobytes() == batched.rollout[name][k].tobytes(), (name, k)
        assert alone.actions[0].tobytes() == batched.actions[k].tobytes()


def test_sigmas_are_the_schedulers_own_and_step_filter_keeps_them_whole(adapter):
    from candidate_scheduler.worker.cosmos3 import build_sglang_request

    sampling = SamplingSpec(rollout=True, steps=6, return_step_indices=(1, 4, 5))
    out = run(adapter, [3, 4, 5], sampling)
    # sglang's own timestep stage on a fresh copy of the pipeline's scheduler
    stage = copy.copy(adapter.timestep_stage)
    stage.scheduler = copy.deepcopy(adapter.scheduler)
    req = build_sglang_request(adapter.server_args, IMAGE, PROMPT, sampling, 0)
    stage.forward(req, adapter.server_args)
    want = stage.scheduler.sigmas.to("cpu").numpy()
    assert want.dtype == np.float32 and want.shape == (7,) and want[-1] == 0.0
    assert out.rollout_meta["sigmas"].tobytes() == want.tobytes()
    assert out.rollout_meta["timesteps"].shape == (6,)
    assert list(out.rollout_meta["step_indices"]) == [1, 4, 5]
    assert out.rollout["log_probs"].shape == (3, 1, 3)
    assert out.rollout["latents"].shape == (3, 1, 3, 16, 7)


def test_reported_log_prob_is_the_gaussian_density_of_the_returned_transition(adapter):
    out = run(adapter, [11, 12])
    r = {k: v.astype(np.float64) for k, v in out.rollout.items()}
    sig = out.rollout_meta["sigmas"].astype(np.float64)
    idx = out.rollout_meta["step_indices"]
    for k in range(2):
        for s, step in enumerate(idx):
            x, m, sd = r["next_latents"][k, 0, s], r["means"][k, 0, s], r["stds"][k, 0, s]
            dens = np.sum(-0.5 * ((x - m) / sd) ** 2 - math.log(sd) - 0.5 * math.log(2 * math.pi))
            assert dens == pytest.approx(r["log_probs"][k, 0, s], rel=1e-5, abs=1e-3)
            sigma, nxt = sig[step], sig[step + 1]
            denom = 1 - (sig[1] if math.isclose(sigma, 1.0) else sigma)
            assert sd == pytest.approx(ROLL.noise_level * math.sqrt(sigma / denom) * math.sqrt(sigma - nxt), rel=1e-5)
        # the trajectory is a chain: each step starts where the last one ended (in the model's bf16)
        for s in range(len(idx) - 1):
            np.testing.assert_allclose(r["latents"][k, 0, s + 1], r["next_latents"][k, 0, s], rtol=1e-2, atol=1e-2)


def test_provided_initial_noise_is_used_and_packed(adapter):
    h, raw = ROLL.horizon, ROLL.raw_action_dim
    gen = np.random.default_rng(0)
    narrow = gen.standard_normal((2, h, raw)).astype(np.float32)
    wide = np.concatenate([narrow, gen.standard_normal((2, h, 64 - raw)).astype(np.float32) + 9.0], axis=2)
    a = run(adapter, [1, 2], noise=narrow)
    b = run(adapter, [1, 2], noise=wide)  # padding channels are zeroed exactly like generated noise
    import torch

    x_t = torch.as_tensor(narrow).to(torch.bfloat16).float().numpy()
    assert a.rollout["latents"][:, 0, 0].tobytes() == x_t.tobytes()
    for name in FIELDS:
        assert a.rollout[name].tobytes() == b.rollout[name].tobytes(), name
    generated = run(adapter, [1, 2])
    assert generated.rollout["latents"][:, 0, 0].tobytes() != x_t.tobytes()


def test_rollouts_through_the_service_atomic_microbatched_co_batched_and_retried(services, adapter):
    seeds = rng.candidate_seeds(31, 4, "per_candidate")
    want = run(adapter, seeds)
    sched = services.scheduler()
    victim = services.worker(sched, "cosmos3", 2, 0.3)
    services.worker(sched, "cosmos3", 2, 0.3)
    sched.wait_workers(2, timeout_s=180)
    with sched.client() as c:
        # microbatched over two workers, and one of them is killed mid-denoise
        rid = c.send(make_request(IMAGE, PROMPT, count=4, reducer="none", seed=31, rollout=True, noise_level=0.7))
        wait_for(lambda: any(str(victim.pid) in wid and (w["step"] or 0) >= 1 for wid, w in c.stats()["workers"].items()),
                 30, "the victim mid-denoise")
        os.kill(victim.pid, signal.SIGKILL)
        r = c.wait(rid, timeout_s=90)
    assert r.status == "done", r.error
    assert r.metrics["microbatches"] == 2 and r.metrics["retries"] == 1
    for name in FIELDS:
        assert r.rollout[name].tobytes() == want.rollout[name][:, 0].tobytes(), name
    assert r.rollout["sigmas"].tobytes() == want.rollout_meta["sigmas"].tobytes()
    assert r.candidates is not None and r.action is None  # no reduction for rollouts


def test_rollouts_co_batched_on_one_worker_keep_their_rows(service, adapter):
    with service.handle.client() as c:
        held = hold_the_worker(c, IMAGE, PROMPT, steps=100)
        a = c.send(make_request(IMAGE, PROMPT, count=2, reducer="none", seed=8, rollout=True, request_id="ro-A"))
        b = c.send(make_request(IMAGE, PROMPT, count=3, reducer="none", seed=9, rollout=True, request_id="ro-B"))
        ra, rb = c.wait(a, timeout_s=90), c.wait(b, timeout_s=90)
        assert all(c.wait(rid, timeout_s=60).status == "done" for rid in held)
        bad = c.submit(IMAGE, PROMPT, count=2, reducer="mean", rollout=True, timeout_s=30)
    assert bad.status == "invalid" and "reducer" in bad.error
    assert ra.metrics["co_batched_batches"] == 1 and rb.metrics["co_batched_batches"] == 1
    for r, seed, n in ((ra, 8, 2), (rb, 9, 3)):
        assert r.status == "done"
        want = run(adapter, rng.candidate_seeds(seed, n, "per_candidate"))
        for name in FIELDS:
            assert r.rollout[name].tobytes() == want.rollout[name][:, 0].tobytes(), (r.request_id, name)


def test_initial_noise_travels_through_the_service(service, adapter):
    noise = np.random.default_rng(4).standard_normal((3, ROLL.horizon, ROLL.raw_action_dim)).astype(np.float32)
    with service.handle.client() as c:
        r = c.submit(IMAGE, PROMPT, count=3, reducer="none", seed=6, rollout=True, initial_noise=noise, timeout_s=90)
        bad = c.submit(IMAGE, PROMPT, count=3, reducer="none", rollout=True, initial_noise=noise[:2], timeout_s=30)
    assert r.status == "done", r.error
    want = run(adapter, rng.candidate_seeds(6, 3, "per_candidate"), noise=noise)
    for name in FIELDS:
        assert r.rollout[name].tobytes() == want.rollout[name][:, 0].tobytes(), name
    assert bad.status == "invalid" and "initial_noise" in bad.error
