"""Issue 16 item 1 (worker side): conditioning reused across groups, bitwise, never across checkpoints.

A robot repeats its instruction for a whole episode and RL rollouts send one observation to many
groups: with `conditioning_cache_mb` the adapter keeps the text pathway K/V (by tokens and length) and
each observation's VAE latent (by image digest, shape and target size) across groups. Results must be
bitwise those without the cache, and an entry must never serve another checkpoint.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

pytestmark = pytest.mark.sglang

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.multimodal_gen")

PROMPT = "pick up the red cube"
PLAIN = SamplingSpec(height=64, width=64, steps=3, horizon=16)
BATCHED_CFG = SamplingSpec(height=64, width=64, steps=3, horizon=16, guidance_scale=2.0, negative_prompt="x" * 274)
SERIAL_CFG = SamplingSpec(height=64, width=64, steps=3, horizon=16, guidance_scale=2.0)


def image(k: int) -> np.ndarray:
    return np.random.default_rng(5000 + k).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


def group(rid, img, spec, seeds) -> GroupWork:
    return GroupWork(rid, img, [PROMPT], spec, [CandidateWork(i, int(s)) for i, s in enumerate(seeds)])


@pytest.fixture(scope="module")
def adapter(model_dir):
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    return Cosmos3CandidateAdapter(model_dir, device="cpu", conditioning_cache_mb=64)


def run(adapter, items):
    outputs, _report = adapter.run_batch(items)
    for out in outputs:
        assert out.status == "ok", out.error
    return outputs


def test_cache_on_and_off_are_bitwise_equal_and_a_second_group_hits(adapter):
    cache = adapter.conditioning_cache
    items = [group("cfg", image(1), BATCHED_CFG, [11, 12]), group("plain", image(2), PLAIN, [13]),
             group("serial", image(1), SERIAL_CFG, [14])]
    cache.resize(0)
    off = run(adapter, items)
    cache.resize(64 * 2**20)
    with adapter.counting() as first_counts:
        first = run(adapter, items)  # fills the cache
    before = adapter.cache_stats()
    assert before["entries"] > 0 and before["bytes"] > 0
    with adapter.counting() as counts:
        # every text row and both observations are cached now
        groups = [adapter.start(item) for item in items]
        assert [(g.report.text_encodes, g.report.vae_encodes) for g in groups] == [(0, 0)] * 3
        for g in groups:
            adapter.release(g)
        second = run(adapter, items)
    assert counts["text"] == 0 and counts["vae"] == 0
    assert first_counts["vae"] == 2  # image(1) is encoded once for two groups
    after = adapter.cache_stats()
    assert after["text_hits"] > before["text_hits"] and after["vae_hits"] >= before["vae_hits"] + 6
    for a, b, c in zip(off, first, second):
        assert a.actions.tobytes() == b.actions.tobytes() == c.actions.tobytes(), a.request_id


def test_a_group_hitting_rows_another_group_computed_matches_sglang(adapter, sglang_reference):
    """The cond text row computed inside a batched-CFG [uncond; cond] call, and the observation's
    latent, serve a later no-CFG group: still bitwise sglang's own run of that group alone."""
    img = image(3)
    run(adapter, [group("cfg", img, BATCHED_CFG, [21])])
    hits = adapter.cache_stats()
    later = adapter.start(group("plain", img, PLAIN, [22, 23]))
    assert (later.report.text_encodes, later.report.vae_encodes) == (0, 0)
    adapter.release(later)
    (out,) = run(adapter, [group("plain", img, PLAIN, [22, 23])])
    assert adapter.cache_stats()["vae_hits"] > hits["vae_hits"]
    for c, seed in enumerate([22, 23]):
        assert np.array_equal(out.actions[c, 0], sglang_reference(img, PROMPT, PLAIN, seed)), c


def test_weight_update_epoch_invalidates(adapter):
    from sglang.multimodal_gen.runtime.cache.conditioning import invalidate_conditioning_caches

    item = group("again", image(4), PLAIN, [31])
    run(adapter, [item])
    invalidate_conditioning_caches()  # what sglang's weight updater calls before changing weights
    g = adapter.start(item)
    assert (g.report.text_encodes, g.report.vae_encodes) == (1, 1)
    adapter.release(g)


def test_another_checkpoint_never_hits(adapter, model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    other_dir = tmp_path / "other-ckpt"
    shutil.copytree(model_dir, other_dir)
    weights = other_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(weights))
    name = "embed_tokens.weight"
    tensors[name] = tensors[name] + 0.05  # the text pathway differs: a leaked K/V would be wrong
    save_file(tensors, str(weights), metadata={"format": "pt"})

    from sglang.multimodal_gen.runtime.server_args import set_global_server_args

    item = group("same-request", image(5), PLAIN, [41, 42])
    (mine,) = run(adapter, [item])
    try:
        other = Cosmos3CandidateAdapter(other_dir, device="cpu", conditioning_cache=adapter.conditioning_cache)
    finally:
        set_global_server_args(adapter.server_args)  # loading set them to the temporary checkpoint's
    assert other.identity != adapter.identity
    before = adapter.cache_stats()
    (theirs,) = run(other, [item])
    after = other.cache_stats()
    assert after["text_hits"] == before["text_hits"] and after["vae_hits"] == before["vae_hits"]
    assert after["text_misses"] > before["text_misses"] and after["vae_misses"] > before["vae_misses"]
    assert theirs.actions.tobytes() != mine.actions.tobytes()
    for c, seed in enumerate([41, 42]):
        assert np.array_equal(theirs.actions[c, 0], other.reference_actions(image(5), PROMPT, PLAIN, seed)), c
    # and the first model still hits its own entries
    g = adapter.start(item)
    assert (g.report.text_encodes, g.report.vae_encodes) == (0, 0)
    adapter.release(g)
