"""The worker's conditioning cache: LRU by bytes, off at 0, keys scoped to one checkpoint and epoch."""

from __future__ import annotations

import os
import shutil

import pytest

from candidate_scheduler.worker.conditioning_cache import ConditioningCache, model_identity


def test_lru_by_bytes_evicts_least_recently_used_first():
    cache = ConditioningCache(100)
    view = cache.for_model(b"model")
    view.put("text", b"a", "A", 40)
    view.put("text", b"b", "B", 40)
    assert view.get("text", b"a") == "A"  # a is now the most recent
    view.put("vae", b"c", "C", 40)  # 120 > 100: b goes, not a
    assert view.get("text", b"b") is None
    assert view.get("text", b"a") == "A" and view.get("vae", b"c") == "C"
    stats = cache.stats()
    assert stats["bytes"] == 80 and stats["entries"] == 2 and stats["evictions"] == 1
    assert (stats["text_hits"], stats["text_misses"], stats["vae_hits"]) == (2, 1, 1)


def test_an_entry_larger_than_the_cache_is_not_stored_and_resize_evicts():
    cache = ConditioningCache(100)
    view = cache.for_model(b"model")
    view.put("vae", b"big", "X", 101)
    assert view.get("vae", b"big") is None and cache.bytes == 0
    view.put("vae", b"a", "A", 60)
    view.put("vae", b"b", "B", 30)
    cache.resize(50)
    assert view.get("vae", b"a") is None and view.get("vae", b"b") == "B" and cache.bytes == 30
    cache.resize(0)
    assert not cache.enabled and cache.bytes == 0 and cache.stats()["entries"] == 0
    misses = cache.stats()["vae_misses"]
    view.put("vae", b"b", "B", 30)
    assert view.get("vae", b"b") is None
    assert cache.stats()["vae_misses"] == misses  # an off cache counts nothing
    with pytest.raises(ValueError):
        ConditioningCache(-1)


def test_keys_are_scoped_to_the_model_and_its_weights_epoch():
    cache = ConditioningCache(1000)
    epoch = {"value": 0}
    one = cache.for_model(b"one", lambda: epoch["value"])
    two = cache.for_model(b"two", lambda: epoch["value"])
    one.put("text", b"k", "from one", 10)
    assert two.get("text", b"k") is None
    assert one.get("text", b"k") == "from one"
    epoch["value"] += 1  # sglang's invalidate_conditioning_caches(): weights changed in place
    assert one.get("text", b"k") is None


def test_model_identity_differs_for_a_copy_and_for_a_changed_weight_file(tmp_path):
    src = tmp_path / "ckpt"
    (src / "transformer").mkdir(parents=True)
    weights = src / "transformer" / "model.safetensors"
    weights.write_bytes(b"\0" * 64)
    (src / "model_index.json").write_text("{}")
    first = model_identity(src)
    assert model_identity(src) == first
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    assert model_identity(copy) != first
    weights.write_bytes(b"\1" * 64)
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert model_identity(src) != first


def test_drop_forgets_one_kind_and_its_bytes():
    cache = ConditioningCache(1000)
    cache.put(("vae", b"m", 0, b"a"), "latent", 300)
    cache.put(("text", b"m", 0, b"b"), "kv", 200)
    cache.drop("vae")
    assert cache.get(("vae", b"m", 0, b"a")) is None and cache.get(("text", b"m", 0, b"b")) == "kv"
    assert cache.bytes == 200 and cache.stats()["entries"] == 1
