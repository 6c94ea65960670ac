"""A weight update while a group runs: a group that starts after it gets K/V of the new weights.

The conditioning cache scopes its entries by sglang's weights epoch (`invalidate_conditioning_caches()`,
called before every in-place weight update). The text pathway's live rows -- the K/V of the rows running
groups hold, served to every group that joins with the same text -- must be scoped the same way: before
the fix a group starting after the update was served the K/V a running group had computed with the
old weights, so its actions were not those of sglang's pipeline on the weights it ran with.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.multimodal_gen")

PROMPT = "pick up the red cube"
SPEC = SamplingSpec(height=64, width=64, steps=2, horizon=16)


def image(k: int) -> np.ndarray:
    return np.random.default_rng(7300 + k).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def adapter(model_dir):
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    return Cosmos3CandidateAdapter(model_dir, device="cpu", conditioning_cache_mb=16)


@contextmanager
def updated_text_weights(adapter):
    """The text pathway's token embeddings changed in place, as sglang's weight updater does it (the
    epoch bumped first), and restored afterwards."""
    from sglang.multimodal_gen.runtime.cache.conditioning import invalidate_conditioning_caches

    param = adapter.transformer.language_model.embed_tokens.weight
    saved = param.detach().clone()
    invalidate_conditioning_caches()
    try:
        with torch.no_grad():
            param.add_(0.05)
        yield
    finally:
        invalidate_conditioning_caches()
        with torch.no_grad():
            param.copy_(saved)


def run_alone(adapter, group):
    while not group.done:
        adapter.step([group])
    return adapter.finish(group)


def test_a_group_started_after_a_weight_update_does_not_get_a_running_groups_old_text_kv(adapter):
    running = adapter.start(GroupWork("running", image(1), [PROMPT], SPEC, [CandidateWork(0, 1)]))
    try:
        adapter.step([running])  # it holds its text rows, computed with the weights of now
        with updated_text_weights(adapter):
            later = adapter.start(GroupWork("later", image(2), [PROMPT], SPEC, [CandidateWork(0, 2)]))
            out = run_alone(adapter, later)
            expected = adapter.reference_actions(image(2), PROMPT, SPEC, 2)
        assert out.status == "ok", out.error
        assert np.array_equal(out.actions[0, 0], expected)
        assert later.report.text_encodes == 1  # the old K/V was nobody's to share any more
    finally:
        adapter.release(running)
    assert not adapter.text.live  # and nothing is left held once both have left
