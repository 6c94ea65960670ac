"""Groups of different shapes that start together share a running batch, each bitwise sglang alone.

Two groups with the same step count started at the same boundary are in lockstep: same schedule, same
solver state. Their rows may still have other shapes (another resolution, another horizon: they run in
separate cohorts), so their solver steps cannot be stacked into one. Before the fix `step_together`
grouped solvers by schedule and state only and `torch.cat`-ed rows of different shapes: the step
raised, and every group of the running batch got an error.
"""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.multimodal_gen")

PROMPT = "pick up the red cube"


def image(k: int, side: int = 64) -> np.ndarray:
    return np.random.default_rng(7100 + k).integers(0, 256, size=(side, side, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def adapter(model_dir):
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    return Cosmos3CandidateAdapter(model_dir, device="cpu")


@pytest.mark.parametrize("other", [
    SamplingSpec(height=64, width=64, steps=2, horizon=8),  # another horizon: other video and action frames
    SamplingSpec(height=32, width=32, steps=2, horizon=16),  # another resolution
])
def test_groups_of_other_shapes_in_lockstep_each_equal_sglang_alone(adapter, other):
    base = SamplingSpec(height=64, width=64, steps=2, horizon=16)
    items = [GroupWork("base", image(1), [PROMPT], base, [CandidateWork(0, 11), CandidateWork(1, 12)]),
             GroupWork("other", image(2), [PROMPT], other, [CandidateWork(0, 13)])]
    for share in (True, False):  # solver sharing on (the default) and off give the same bits
        adapter.share_solvers = share
        try:
            outputs, _report = adapter.run_batch(items)
        finally:
            adapter.share_solvers = True
        for item, out in zip(items, outputs):
            assert out.status == "ok", f"{item.request_id} (share_solvers={share}): {out.error}"
            for row, cand in enumerate(item.candidates):
                expected = adapter.reference_actions(item.images, PROMPT, item.sampling, cand.seed)
                assert np.array_equal(out.actions[row, 0], expected), (item.request_id, row, share)
