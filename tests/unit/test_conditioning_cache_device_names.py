"""One device, one conditioning-cache identity, whatever it was called (worker/cosmos3.py,
worker/conditioning_cache.py `device_name`).

The device is part of a Cosmos3 adapter's cache identity (a CPU and a CUDA adapter may share one cache).
It was `str(torch.device(device))`, so two names of one device -- "cuda" and "cuda:0" with device 0
current, "cpu" and "cpu:0" -- gave two identities: adapters sharing a cache never reused each other's
conditioning and held it twice. And "cuda" named whichever device was current at load time under one
identity, so an adapter loaded on device 1 could be served another's device-0 tensors.
"""

from __future__ import annotations

import pytest

from candidate_scheduler.worker.conditioning_cache import device_name


@pytest.mark.parametrize(("name", "current", "expected"), [
    ("cuda", 0, "cuda:0"),  # the current device, as torch places "cuda" tensors
    ("cuda:0", 0, "cuda:0"),
    ("cuda", 1, "cuda:1"),
    ("cuda:0", 1, "cuda:0"),  # an explicit index is that device whatever is current
    ("cpu", None, "cpu"),
    ("cpu:0", None, "cpu"),  # one CPU device, whatever its index
])
def test_each_name_of_a_device_gives_that_devices_one_name(name, current, expected):
    assert device_name(name, current) == expected


def test_cuda_names_of_different_devices_stay_apart():
    assert device_name("cuda", 1) != device_name("cuda:0", 1)


def test_cuda_without_a_current_device_is_left_as_named():
    # no CUDA to ask (a CPU-only build): nothing to resolve it against
    assert device_name("cuda", None) == "cuda"


@pytest.mark.sglang
def test_two_adapters_on_one_device_named_two_ways_share_one_identity(model_dir):
    pytest.importorskip("torch")
    pytest.importorskip("sglang.multimodal_gen")
    from candidate_scheduler.worker.conditioning_cache import ConditioningCache
    from candidate_scheduler.worker.cosmos3 import Cosmos3CandidateAdapter

    cache = ConditioningCache(2**20)
    plain = Cosmos3CandidateAdapter(model_dir, device="cpu", conditioning_cache=cache)
    indexed = Cosmos3CandidateAdapter(model_dir, device="cpu:0", conditioning_cache=cache)
    assert plain.identity == indexed.identity
