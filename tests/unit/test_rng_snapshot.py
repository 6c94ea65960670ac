"""Generator snapshot/restore (needs torch; skipped where torch is absent)."""

import pytest

from candidate_scheduler.core import rng
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.worker import generators

torch = pytest.importorskip("torch")


def test_restore_draws_identical_numbers():
    g = torch.Generator().manual_seed(1234)
    torch.rand(7, generator=g)  # advance it first: the snapshot must capture mid-stream state too
    blob = generators.snapshot(g)
    h = generators.restore(blob)
    assert h is not g
    assert torch.equal(torch.randn(64, generator=g), torch.randn(64, generator=h))


def test_snapshot_before_draws_resumes_exactly_and_does_not_advance_source():
    g = torch.Generator().manual_seed(99)
    blob = generators.snapshot(g)
    first = torch.randn(32, generator=g)
    again = torch.randn(32, generator=generators.restore(blob))
    assert torch.equal(first, again)
    # Restoring twice more must not disturb g: g keeps its own stream.
    expected_next = torch.randn(32, generator=generators.restore(generators.snapshot(g)))
    generators.restore(blob)
    assert torch.equal(torch.randn(32, generator=g), expected_next)


def test_fresh_snapshot_equals_manual_seed():
    seed = rng.candidate_seeds(42, 3)[2]
    a = torch.randn(16, generator=generators.restore(generators.fresh_snapshot(seed)))
    b = torch.randn(16, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(a, b)
    assert generators.snapshot_device(generators.fresh_snapshot(seed)) == "cpu"


def test_restore_refuses_other_device_and_garbage():
    blob = generators.fresh_snapshot(3)
    with pytest.raises(CandidateContractError) as info:
        generators.restore(blob, device="cuda")
    assert info.value.code == "bad_snapshot"
    for bad in (b"", b"nonsense", blob[:6], b"CSG1\x03cpu" + b"\x00" * 3):
        with pytest.raises(CandidateContractError):
            generators.restore(bad)




@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_snapshot_round_trip():
    g = torch.Generator(device="cuda").manual_seed(5)
    blob = generators.snapshot(g)
    assert generators.snapshot_device(blob) == "cuda"
    h = generators.restore(blob, device="cuda")
    assert torch.equal(torch.randn(64, device="cuda", generator=g), torch.randn(64, device="cuda", generator=h))
    assert blob == generators.fresh_snapshot(5, device="cuda")
    with pytest.raises(CandidateContractError):
        generators.restore(blob, device="cpu")
