"""The null adapter: a model-free stand-in for scheduler tests and the admission benchmark. Never the product."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.core.work import BatchReport, GroupOutput, SamplingSpec


class NullAdapter:
    """A model-free adapter for scheduler tests and the admission benchmark: actions are a pure
    function of (seed, observation mean), so results are checkable; optional per-step delay and a
    per-step hook let tests place a cancel or a kill at a chosen step. Never the product."""

    def __init__(self, max_candidates_per_batch: int = 8):
        self.max_candidates_per_batch = max_candidates_per_batch

    def capability_dict(self) -> dict:
        return {
            "model_name": "null",
            "action_tensor": "actions",
            "action_shape": [None, None],
            "action_dtype": "float32",
            "reduce_after_denormalize": True,
            "reducers": ["none", "mean", "median", "medoid"],
            "action_modes": ["policy"],
            "candidate_invariant": [],
            "auxiliary_branch_required": False,
            "max_candidates_per_batch": self.max_candidates_per_batch,
            "max_candidates_per_group": 256,
            "equivalence": {"dtype": "float32", "atol": 0.0, "rtol": 0.0, "bitwise_on_cpu": True},
        }

    @staticmethod
    def expected(seed: int, image_mean: float, sampling: SamplingSpec) -> np.ndarray:
        rng = np.random.default_rng(int(seed))
        return (rng.standard_normal((sampling.horizon, sampling.raw_action_dim)) + image_mean).astype(np.float32)

    def run_batch(self, items, should_drop=None, on_step=None):
        report = BatchReport()
        outputs = []
        dropped: set[str] = set()
        steps = max((it.sampling.steps for it in items), default=0)
        for i in range(steps):
            if on_step is not None:
                on_step(i)
            if should_drop is not None:
                dropped |= set(should_drop() or ())
                if dropped >= {it.request_id for it in items}:
                    break  # every group left: the batch slot is free now
            report.transformer_forwards += 1
            report.steps_run += 1
        for it in items:
            report.rows += len(it.candidates) * len(it.images)
            if it.request_id in dropped:
                outputs.append(GroupOutput(it.request_id, "cancelled"))
                continue
            means = [float(np.asarray(img, dtype=np.float64).mean()) for img in it.images]
            actions = np.stack(
                [np.stack([self.expected(c.seed, m, it.sampling) for m in means]) for c in it.candidates]
            )
            outputs.append(GroupOutput(it.request_id, "ok", [c.candidate_id for c in it.candidates], actions))
        return outputs, report
