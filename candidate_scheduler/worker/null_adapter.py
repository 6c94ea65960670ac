"""The null adapter: a model-free step adapter for scheduler tests and the admission benchmark.

Actions are a pure function of (seed, observation mean), so every result is checkable; a group runs
`sampling.steps` steps and may share them with any other group. Never the product.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from candidate_scheduler.core.spec import EquivalenceRule, ModelCapability
from candidate_scheduler.core.work import BatchReport, GroupOutput, GroupWork, SamplingSpec
from candidate_scheduler.worker import stepping


@dataclass
class NullGroup:
    item: GroupWork
    steps: int
    rows: int
    request_id: str = ""
    step_index: int = 0
    report: BatchReport = field(default_factory=BatchReport)

    @property
    def done(self) -> bool:
        return self.step_index >= self.steps


class NullAdapter:
    concurrent_start = True  # start touches nothing step, finish or release use

    def __init__(self, max_candidates_per_batch: int = 8):
        self.max_candidates_per_batch = max_candidates_per_batch

    def capability_dict(self) -> dict:
        return ModelCapability(
            model_name="null",
            action_tensor="actions",
            reducers=("none", "mean", "median", "medoid"),
            max_candidates_per_batch=self.max_candidates_per_batch,
            max_candidates_per_group=256,
            equivalence=EquivalenceRule(dtype="float32", bitwise_on_cpu=True),
        ).to_dict()

    @staticmethod
    def expected(seed: int, image_mean: float, sampling: SamplingSpec) -> np.ndarray:
        rng = np.random.default_rng(int(seed))
        return (rng.standard_normal((sampling.horizon, sampling.raw_action_dim)) + image_mean).astype(np.float32)

    def start(self, item: GroupWork) -> NullGroup:
        if not item.candidates:
            raise stepping.BadRequest("no_candidates", "a group slice must carry at least one candidate")
        rows = len(item.candidates) * len(item.images)
        group = NullGroup(item, item.sampling.steps, rows, item.request_id)
        group.report.rows = rows
        return group

    def step(self, groups) -> int:
        for g in groups:
            g.step_index += 1
            g.report.steps_run += 1
            g.report.transformer_forwards += 1
        return 1 if groups else 0

    def finish(self, group: NullGroup) -> GroupOutput:
        it = group.item
        means = [float(np.asarray(img, dtype=np.float64).mean()) for img in it.images]
        actions = np.stack([np.stack([self.expected(c.seed, m, it.sampling) for m in means]) for c in it.candidates])
        return GroupOutput(it.request_id, "ok", [c.candidate_id for c in it.candidates], actions)

    def release(self, group: NullGroup) -> None:
        pass

    def run_batch(self, items, should_drop=None, on_step=None):
        return stepping.run_batch(self, items, should_drop, on_step)
