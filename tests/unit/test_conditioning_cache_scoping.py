"""Conditioning-cache scoping that a stale entry would break: a checkpoint whose component folders are
symlinks, and a weight update that lands while a missed entry is being computed."""

from __future__ import annotations

import pytest

from candidate_scheduler.worker.conditioning_cache import ConditioningCache, model_identity


def _weights(folder, nbytes: int) -> None:
    folder.mkdir(parents=True)
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(b"\0" * nbytes)


def test_model_identity_sees_weights_behind_a_symlinked_component_folder(tmp_path):
    # a checkpoint assembled with `ln -s`: the same root, the transformer repointed at other weights
    _weights(tmp_path / "run_a", 64)
    _weights(tmp_path / "run_b", 128)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model_index.json").write_text("{}")
    link = ckpt / "transformer"
    link.symlink_to(tmp_path / "run_a", target_is_directory=True)
    first = model_identity(ckpt)
    link.unlink()
    link.symlink_to(tmp_path / "run_b", target_is_directory=True)
    assert model_identity(ckpt) != first


def test_model_identity_survives_a_symlink_cycle(tmp_path):
    ckpt = tmp_path / "ckpt"
    _weights(ckpt / "vae", 32)
    (ckpt / "vae" / "loop").symlink_to(ckpt, target_is_directory=True)
    assert model_identity(ckpt) == model_identity(ckpt)  # terminates, and is deterministic


def test_an_entry_computed_across_a_weight_update_is_not_served_after_it():
    cache = ConditioningCache(1000)
    epoch = {"value": 0}
    view = cache.for_model(b"model", lambda: epoch["value"])
    assert view.get("vae", b"obs") is None  # a miss: the caller encodes with the weights of epoch 0
    epoch["value"] += 1  # invalidate_conditioning_caches(): the weights change while it encodes
    view.put("vae", b"obs", "latent of the old weights", 10)
    assert view.get("vae", b"obs") is None
    # an entry computed within one epoch is still kept and served
    view.put("vae", b"obs", "latent of the new weights", 10)
    assert view.get("vae", b"obs") == "latent of the new weights"


@pytest.mark.parametrize("nbytes", [-1, -(10**6)])
def test_a_negative_size_is_refused_and_cannot_push_the_cache_past_its_budget(nbytes):
    cache = ConditioningCache(100)
    with pytest.raises(ValueError, match="bytes"):
        cache.put(("vae", b"m", 0, b"neg"), "x", nbytes)
    cache.put(("vae", b"m", 0, b"a"), "A", 90)
    cache.put(("vae", b"m", 0, b"b"), "B", 90)
    assert cache.bytes <= cache.max_bytes and cache.stats()["entries"] == 1

