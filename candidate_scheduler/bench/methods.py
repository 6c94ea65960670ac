"""The four ways to get N candidates of one group, (a)-(d), each ending with the served action.

(a), (b) and (c) run in this process on one shared sglang pipeline (the adapter's hooks leave B=1
results unchanged), on the compute thread; (d) goes through a `serve` process and a cosmos3 worker
process, over ZMQ."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from candidate_scheduler.bench.common import PROMPT
from candidate_scheduler.bench.inprocess import ComputeThread, StageTimer
from candidate_scheduler.bench.settings import BASE_SEED, REDUCER
from candidate_scheduler.service.launcher import SchedulerHandle


@dataclass
class Run:
    latency_s: float
    actions: np.ndarray  # [N, H, D] float32
    forwards: int | None
    condition_s: float | None
    reducer_s: float | None
    extra: dict | None = None


class Bench:
    """The four ways to get N candidates for one shape (one observation, one prompt)."""

    def __init__(self, adapter, service: SchedulerHandle, device: str, main_thread: bool = False, sglang_cache: str = "text"):
        from candidate_scheduler.service.client import synthetic_image

        self.adapter = adapter
        self.pipeline = adapter.pipeline
        self.server_args = adapter.server_args
        self.service = service
        self.client = service.client()
        self.device = device
        self.cuda = device.startswith("cuda")
        self.timer = StageTimer(self.pipeline)
        self._synthetic_image = synthetic_image
        self._rid = 0
        self.sampling = None
        self.image = None
        self.compute = None if main_thread else ComputeThread()
        self.sglang_cache = sglang_cache

    def set_shape(self, shape: dict) -> None:
        from candidate_scheduler.core.work import SamplingSpec

        self.sampling = SamplingSpec(height=shape["height"], width=shape["width"], steps=shape["steps"])
        self.set_image(0)

    def set_image(self, seed: int) -> None:
        """The observation of the next group (uint8 [H, W, 3] at the shape's resolution)."""
        self.image = self._synthetic_image(self.sampling.height, self.sampling.width, seed=seed)

    def seeds(self, n: int) -> tuple[int, ...]:
        from candidate_scheduler.core import rng

        return rng.candidate_seeds(BASE_SEED, n, "per_candidate")

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def _reduce(self, actions: np.ndarray) -> tuple[np.ndarray, float]:
        from candidate_scheduler.core import reducers

        t0 = time.perf_counter()
        action = reducers.reduce(REDUCER, actions)
        return action, time.perf_counter() - t0

    def run(self, method: str, n: int) -> Run:
        fn = getattr(self, method)
        if self.compute is None or method == "d_scheduler_e2e":
            return fn(n)  # (d)'s model work runs on the worker process's own compute thread
        return self.compute.call(fn, n)

    def _conditioning_cache(self):
        return getattr(getattr(self.pipeline, "executor", None), "conditioning_cache", None)

    def fresh_conditioning(self) -> None:
        """Before each method of a group, per --sglang-cache: "text" (default) drops the VAE entries of
        sglang's cross-request conditioning cache, so each method pays its own observation encode
        (a real client's observation is new each time) while the instruction's text K/V stays cached
        across requests as sglang ships it; "cold" empties the cache; "warm" leaves it alone. (a)
        always reuses its own first call's encodes for its other N-1 calls, as sglang does."""
        cache = self._conditioning_cache()
        if cache is None or self.sglang_cache == "warm":
            return
        if self.sglang_cache == "cold":
            cache.clear()
            return
        vae = getattr(self.adapter.latent_stage, "vae", None)
        if vae is None:
            cache.clear()
        else:
            cache.invalidate({id(p) for p in vae.parameters()})

    def _cache_counts(self) -> tuple[int, int]:
        cache = self._conditioning_cache()
        if cache is None:
            return 0, 0
        return int(getattr(cache, "hits", 0)), int(getattr(cache, "misses", 0))

    def torch_threads(self) -> int:
        import torch

        return self.compute.call(torch.get_num_threads) if self.compute is not None else torch.get_num_threads()

    # (a) -----------------------------------------------------------------------------------------
    def a_sequential(self, n: int) -> Run:
        from candidate_scheduler.worker.cosmos3 import sglang_reference_actions

        seeds = self.seeds(n)
        cond0 = self.timer.total
        hits0, misses0 = self._cache_counts()
        with self.adapter.counting() as counts:
            t0 = time.perf_counter()
            actions = np.stack([
                sglang_reference_actions(self.pipeline, self.server_args, self.image, PROMPT, self.sampling, s)
                for s in seeds
            ])
            _action, red = self._reduce(actions)
            self._sync()
            latency = time.perf_counter() - t0
        return Run(latency, actions, counts["forwards"], self.timer.total - cond0, red, self._cache_extra(hits0, misses0))

    def _cache_extra(self, hits0: int, misses0: int) -> dict:
        hits, misses = self._cache_counts()
        return {"sglang_conditioning_cache_hits": hits - hits0, "sglang_conditioning_cache_misses": misses - misses0}

    # (b) -----------------------------------------------------------------------------------------
    def b_sglang_batch(self, n: int) -> Run:
        from candidate_scheduler.worker.cosmos3 import build_sglang_request

        cond0 = self.timer.total
        hits0, misses0 = self._cache_counts()
        with self.adapter.counting() as counts:
            t0 = time.perf_counter()
            req = build_sglang_request(self.server_args, [self.image] * n, PROMPT, self.sampling, BASE_SEED)
            out = self.pipeline.forward(req, self.server_args)
            if out.error:
                raise RuntimeError(f"sglang image-list batch failed: {out.error}")
            actions = np.asarray(out.output[0]["actions"], dtype=np.float32).reshape(n, self.sampling.horizon, -1)
            _action, red = self._reduce(actions)
            self._sync()
            latency = time.perf_counter() - t0
        return Run(latency, actions, counts["forwards"], self.timer.total - cond0, red, self._cache_extra(hits0, misses0))

    # (c) -----------------------------------------------------------------------------------------
    def c_worker_batch(self, n: int) -> Run:
        from candidate_scheduler.core.work import CandidateWork, GroupWork

        seeds = self.seeds(n)
        self._rid += 1
        t0 = time.perf_counter()
        item = GroupWork(
            request_id=f"bench-c-{self._rid}", images=self.image[None], prompts=[PROMPT], sampling=self.sampling,
            candidates=[CandidateWork(i, s) for i, s in enumerate(seeds)],
        )
        outputs, report = self.adapter.run_batch([item])
        out = outputs[0]
        if out.status != "ok":
            raise RuntimeError(f"worker batch failed: {out.error_code}: {out.error}")
        actions = np.asarray(out.actions)[:, 0]
        _action, red = self._reduce(actions)
        self._sync()
        latency = time.perf_counter() - t0
        return Run(latency, actions, report.transformer_forwards, report.condition_s, red,
                   {"model_s": report.condition_s + report.denoise_s + report.postprocess_s,
                    "denoise_s": report.denoise_s, "rows": report.rows})

    # (d) -----------------------------------------------------------------------------------------
    def d_scheduler_e2e(self, n: int) -> Run:
        s = self.sampling
        t0 = time.perf_counter()
        result = self.client.submit(
            self.image, PROMPT, count=n, seed=BASE_SEED, reducer=REDUCER, return_candidates=True, timeout_s=600,
            height=s.height, width=s.width, steps=s.steps, horizon=s.horizon, guidance_scale=float(s.guidance_scale),
            action_mode=s.action_mode, domain_id=s.domain_id, raw_action_dim=s.raw_action_dim, fps=s.fps,
        )
        latency = time.perf_counter() - t0
        if not result.ok:
            raise RuntimeError(f"scheduler group failed: {result.status}: {result.error_code}: {result.error}")
        if tuple(result.candidate_seeds) != self.seeds(n):
            raise RuntimeError(f"scheduler used seeds {result.candidate_seeds}, expected {self.seeds(n)}")
        m = result.metrics
        return Run(latency, np.asarray(result.candidates, dtype=np.float32), m.get("physical_forwards"),
                   m.get("condition_s"), m.get("reducer_s"),
                   {"admission_mode": m.get("admission_mode"), "microbatches": m.get("microbatches"),
                    "scheduler_total_s": m.get("total_s"), "queue_wait_s": m.get("queue_wait_s"),
                    "model_s": sum(float(m.get(k) or 0.0) for k in ("condition_s", "denoise_s", "postprocess_s")),
                    "worker_s": m.get("worker_s"), "receipt_to_reply_s": m.get("receipt_to_reply_s"),
                    "denoise_s": m.get("denoise_s")})

    def worker_pid(self) -> int:
        return self.service.workers[0].pid

    def close(self) -> None:
        self.client.close()
        if self.compute is not None:
            self.compute.close()
