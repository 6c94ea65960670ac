"""Cosmos3 candidate adapter: candidate groups as a step-level running batch, on sglang 0.5.23's own
Cosmos3 model code.

The adapter implements `stepping.StepAdapter`: `start` prepares a group (cosmos3_rows), `step`
advances the running groups by one denoise step, sharing forwards where they can (cosmos3_step),
`finish` turns a done group into actions (cosmos3_outputs), `release` drops a group that leaves early.
Groups join and leave at any step boundary; whatever shares its forwards, a candidate's actions are
bitwise those of sglang's own pipeline run alone with that candidate's seed (bf16): on the CPU with
candidates batched in one transformer call, on CUDA with one candidate a call (`call_rows`, "auto"
picks each), where batched calls are not bitwise (measured, see `bitwise`).

What this file owns: loading, the hooks on sglang's modules, the capability, and the adapter class.

- Hooks. The UND text pathway (`transformer.language_model.forward`) and the latent stage's VAE encode
  are wrapped (cosmos3_conditioning) so conditioning is computed once per group, and with the
  conditioning cache once per content across groups. `proj_out` gets the input layout sglang's own
  request would give it: at B > 1 sglang hands it a non-contiguous slice and `F.linear` then takes
  another kernel path (about 1 bf16 ulp apart when the layer has a non-zero bias). Where the reference
  forward runs at B = 1 (no CFG, serial CFG) our forwards make that input contiguous; in the
  batched-CFG path the reference forward itself runs at B = 2 on a non-contiguous slice, so ours is
  left as it is. Every hook is inert outside our own forwards, so sglang's pipeline (the reference)
  runs unchanged.
- Threads. The worker's compute thread drives step/finish/release; `start` may run on the worker's
  conditioning thread at the same time (`concurrent_start`, worker/preparing.py). They share only the
  text pathway's live K/V rows (guarded by its own lock; a start never takes the serving path, which is
  per thread) and the conditioning cache (locked); a start touches the shared stage scheduler only to
  copy it, and a step never reads it. Two locks: `_lock` serialises steps, finishes and releases,
  `_start_lock` serialises starts; `reference_actions` (sglang's whole pipeline) takes both, in that
  order, as `run_batch` does.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from candidate_scheduler.core.spec import EquivalenceRule, ModelCapability
from candidate_scheduler.core.work import BatchReport, GroupOutput, GroupWork, SamplingSpec
from candidate_scheduler.worker import stepping
from candidate_scheduler.worker.call_rows import resolve as call_rows_of
from candidate_scheduler.worker.conditioning_cache import ConditioningCache, device_name, model_identity
from candidate_scheduler.worker.cosmos3_conditioning import TextPathway, VaeEncoder
from candidate_scheduler.worker.cosmos3_outputs import finish_group
from candidate_scheduler.worker.cosmos3_rows import Cosmos3Group, start_group
from candidate_scheduler.worker.cosmos3_sglang import (  # noqa: F401 - the benchmarks' and tests' entry points
    build_sglang_request,
    load_sglang_pipeline,
    sglang_reference_actions,
)
from candidate_scheduler.worker.cosmos3_step import Cohorts, run_step


class Cosmos3CandidateAdapter:
    """Runs candidate groups of Cosmos3 action-policy requests as a step-level running batch."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        device: str = "cpu",
        max_candidates_per_batch: int = 8,
        conditioning_cache_mb: float = 0,
        conditioning_cache: ConditioningCache | None = None,
        call_rows: int | str | None = "auto",
    ):
        import torch

        self.model_dir = str(Path(model_dir).resolve())
        self.device = device
        self.max_candidates_per_batch = int(max_candidates_per_batch)
        # the most candidate rows one transformer call carries (None: a cohort's rows in one call);
        # read at every step (cosmos3_step.call_spans)
        self.call_rows = call_rows_of(call_rows, device)
        self.pipeline, self.server_args = load_sglang_pipeline(model_dir, device)
        self._torch = torch
        stages = {type(s).__name__: s for s in self.pipeline.stages}
        self.preprocess_stage = stages["Cosmos3ImagePreprocessStage"]
        self.tokenize_stage = stages["Cosmos3TokenizationStage"]
        self.latent_stage = stages["Cosmos3LatentPreparationStage"]
        self.timestep_stage = stages["Cosmos3TimestepPreparationStage"]
        self.denoise_stage = stages["Cosmos3DenoisingStage"]
        if self.timestep_stage.scheduler is not self.denoise_stage.scheduler:
            # a group's solvers are copies of the scheduler the timestep stage prepares, which is the
            # one sglang's denoise loop steps; a pipeline that splits them needs another copy rule
            raise RuntimeError("Cosmos3 timestep and denoising stages do not share one scheduler")
        self.transformer = self.denoise_stage.transformer
        self.scheduler = self.denoise_stage.scheduler
        self.action_dim = int(self.transformer.action_dim)
        self.stats_path = self.server_args.pipeline_config.action_stats_path
        self.stats_dim = _stats_dim(self.stats_path)
        # the device is part of what a cached tensor is: a CPU and a CUDA adapter may share one cache;
        # one name per device, so "cuda" and "cuda:0" share entries and "cuda" on device 1 does not
        placed = torch.device(device)
        current = torch.cuda.current_device() if placed.type == "cuda" and torch.cuda.is_available() else None
        self.identity = model_identity(self.model_dir) + device_name(str(placed), current).encode()
        if conditioning_cache is None:
            conditioning_cache = ConditioningCache(int(float(conditioning_cache_mb) * 2**20))
        self.conditioning_cache = conditioning_cache
        model_cache = conditioning_cache.for_model(self.identity, _weights_epoch())
        self._counts = {"forwards": 0, "text": 0, "vae": 0}
        self._lock = threading.RLock()
        self._start_lock = threading.RLock()
        self.concurrent_start = True
        self._uids = itertools.count(1)
        self.proj_out_contiguous = False  # set only around our forwards whose reference runs at B=1
        # off the CPU a text row's K/V may depend on the rows its call computed (cosmos3_conditioning)
        self.text = TextPathway(self.transformer.language_model, self._counts, model_cache,
                                by_request_rows=device != "cpu")
        self.vae = VaeEncoder(self.latent_stage, self._counts, model_cache)
        self.cohorts = Cohorts(self.transformer)
        # groups in lockstep step their UniPC solvers once over all their rows (cosmos3_solvers); off:
        # every group steps its own, as the step profile's "before" arm measures
        self.share_solvers = True
        self._install_hooks()

    def _install_hooks(self) -> None:
        counts = self._counts

        def contiguous_input(_module, args):
            if not self.proj_out_contiguous:
                return None
            return (args[0].contiguous(),) + tuple(args[1:])

        self.transformer.proj_out.register_forward_pre_hook(contiguous_input)

        def count_forward(_module, _args, _kwargs):
            counts["forwards"] += 1

        self.transformer.register_forward_pre_hook(count_forward, with_kwargs=True)

    # ---- capability --------------------------------------------------------------------------------
    def capability(self) -> ModelCapability:
        return ModelCapability(
            model_name="cosmos3",
            action_tensor="action_latents",
            action_shape=(None, None),
            action_dtype="float32",
            reduce_after_denormalize=True,
            reducers=("none", "mean", "median", "medoid"),
            action_modes=("policy",),
            candidate_invariant=("text_tokens", "und_text_kv", "image_latent", "timesteps", "rope"),
            auxiliary_branch_required=True,  # video latents are denoised jointly with actions
            max_candidates_per_batch=self.max_candidates_per_batch,
            max_candidates_per_group=256,
            equivalence=EquivalenceRule(
                dtype="bfloat16",
                atol=0.0 if self.bitwise else 5e-2,
                rtol=0.0 if self.bitwise else 5e-2,
                bitwise_on_cpu=True,
            ),
        )

    @property
    def bitwise(self) -> bool:
        """Whether a candidate's actions are declared bitwise sglang's alone. The CPU's batched calls are
        (the parity tests). On CUDA they are not: an H200 with random weights gave max abs 0.56 over 10
        steps with CFG (bench/results/gpu_check_20261204b), where the 5e-2 declared for them is not met
        either. One candidate a call is sglang's own call shape. What the claim rests on: N=1 was
        bitwise there, measured without CFG only (the methods rows; the CFG calls, B=2 or two of B=1,
        were not measured alone); `make gpu-check`'s equivalence phase checks it with CFG on the next
        loan."""
        return self.device == "cpu" or self.call_rows == 1

    def capability_dict(self) -> dict:
        """What this adapter declares (spec.ModelCapability as a dict)."""
        return self.capability().to_dict()

    # ---- the running batch (stepping.StepAdapter) ----------------------------------------------------
    def start(self, item: GroupWork) -> Cosmos3Group:
        """Conditioning, starting noise and own solvers of one group; it joins at the next step.
        Raises stepping.BadRequest (ObservationError) for a request that cannot run."""
        with self._start_lock, self._torch.inference_mode():
            return start_group(self, item, next(self._uids))

    def step(self, groups: Sequence[Cosmos3Group]) -> int:
        """Advance every given group by one denoise step; returns the transformer forwards run."""
        if not groups:
            return 0
        with self._lock, self._torch.inference_mode():
            forwards = run_step(self, groups)
            if self.device.startswith("cuda"):
                # CUDA kernels run after the call returns: wait for them, so the time callers take around a
                # step (the warm-up profile, step records, the cost model's forecasts) is the step's, not
                # its launch's, and the wait is not charged to whatever reads the device next
                self._torch.cuda.synchronize(self.device)
            return forwards

    def finish(self, group: Cosmos3Group) -> GroupOutput:
        """The output of a done group; the group leaves the batch."""
        if not group.done:
            raise ValueError(f"group {group.request_id!r} is at step {group.step_index} of {group.steps}")
        with self._lock, self._torch.inference_mode():
            try:
                output = finish_group(group, self.stats_path)
            finally:
                self._leave(group)
            group.report.peak_memory_bytes = self._peak_memory()
            return output

    def release(self, group: Cosmos3Group) -> None:
        """Drop a group that leaves before it is done (cancelled, expired, failed)."""
        with self._lock:
            self._leave(group)

    def _leave(self, group: Cosmos3Group) -> None:
        self.text.release(group.text_keys)
        group.text_keys = []
        self.cohorts.drop_group(group.uid)

    def run_batch(
        self,
        items: list[GroupWork],
        should_drop: Callable[[], Iterable[str]] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> tuple[list[GroupOutput], BatchReport]:
        """Run a fixed set of groups from their first step to their last (stepping.run_batch): bad
        groups get an error output, the others run, sharing forwards where they can.

        should_drop() is polled at every step boundary and returns request ids to cancel; on_step(i)
        runs just before step i (a hook for tests and progress)."""
        with self._lock:
            outputs, report = stepping.run_batch(self, items, should_drop=should_drop, on_step=on_step)
            report.peak_memory_bytes = max(report.peak_memory_bytes, self._peak_memory())
            return outputs, report

    def cache_stats(self) -> dict:
        """The conditioning cache's counters (hits, misses, evictions, bytes in use) for metrics."""
        return self.conditioning_cache.stats()

    # ---- references and counters ----------------------------------------------------------------------
    def reference_actions(self, image: np.ndarray, prompt: str, sampling: SamplingSpec, seed: int) -> np.ndarray:
        """sglang's own pipeline for one seed (the counting hooks stay installed; the others are inert
        here, so the numerics are sglang's unchanged)."""
        with self._lock, self._start_lock:
            return sglang_reference_actions(self.pipeline, self.server_args, image, prompt, sampling, seed)

    @contextmanager
    def with_call_rows(self, rows: int | str | None):
        """Inside the block the transformer calls carry at most `rows` candidates (as `--call-rows` reads
        it; None: all of a cohort); for benchmarks and tests that compare ways of calling on one loaded
        model."""
        before = self.call_rows
        self.call_rows = call_rows_of(rows, self.device)
        try:
            yield
        finally:
            self.call_rows = before

    @contextmanager
    def counting(self):
        """Yields a dict that holds the forward/text/vae call counts made inside the block."""
        before = dict(self._counts)
        delta: dict = {}
        try:
            yield delta
        finally:
            delta.update({k: self._counts[k] - before[k] for k in before})

    def _peak_memory(self) -> int:
        torch = self._torch
        if self.device.startswith("cuda") and torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _weights_epoch() -> Callable[[], int]:
    """sglang's weights epoch: bumped by `invalidate_conditioning_caches()` on weight updates."""
    from sglang.multimodal_gen.runtime.cache.conditioning import conditioning_weights_epoch

    return conditioning_weights_epoch


def _stats_dim(path: str | None) -> int | None:
    if not path:
        return None
    import json

    try:
        stats = json.loads(Path(path).read_text())
        return len(stats["global"]["q01"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # sglang's own loader reports a bad stats file when it is used
