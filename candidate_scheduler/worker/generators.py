"""Generator snapshots: a candidate's exact torch.Generator state as bytes, so a retry on any worker
resumes the very random stream the failed attempt would have drawn.

Snapshots are ``torch.Generator.get_state()`` bytes behind a small header naming the device type, so a
CPU state is never silently loaded into a CUDA generator (their state layouts differ). They live on the
worker side: the scheduler carries them as opaque bytes (core/work.py) and never imports torch.
"""

from __future__ import annotations

import struct

import torch

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.rng import check_seed

_MAGIC = b"CSG1"  # candidate-scheduler generator snapshot, format 1


def snapshot(generator: torch.Generator) -> bytes:
    """The generator's exact state as bytes: header (magic, device type) + get_state() bytes.

    Reading the state does not advance the generator.
    """
    device_type = generator.device.type.encode("ascii")
    state = generator.get_state()  # a CPU uint8 tensor for every device type
    return _MAGIC + struct.pack("B", len(device_type)) + device_type + bytes(state.numpy().tobytes())


def restore(blob: bytes, device: str = "cpu") -> torch.Generator:
    """A NEW generator on `device` in exactly the snapshotted state.

    Never mutates an existing generator: a retry must not share a generator object with an attempt
    that may still be drawing from it.
    """
    device_type, state = _parse(blob)
    target = torch.device(device)
    if target.type != device_type:
        raise CandidateContractError(
            "snapshot", "bad_snapshot",
            f"snapshot was taken on a {device_type!r} generator, cannot restore on {device!r}", device,
        )
    generator = torch.Generator(device=target)
    try:
        generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    except RuntimeError as exc:  # wrong length or layout for this device's generator
        raise CandidateContractError("snapshot", "bad_snapshot", f"state rejected: {exc}", len(state)) from None
    return generator


def fresh_snapshot(seed: int, device: str = "cpu") -> bytes:
    """The snapshot of ``torch.Generator(device).manual_seed(seed)``: a candidate's fresh state."""
    check_seed(seed)
    return snapshot(torch.Generator(device=device).manual_seed(seed))


def snapshot_device(blob: bytes) -> str:
    """The device type ("cpu", "cuda", ...) a snapshot was taken on."""
    return _parse(blob)[0]


def _parse(blob: bytes) -> tuple[str, bytes]:
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CandidateContractError("snapshot", "bad_snapshot", "snapshot must be bytes", type(blob))
    blob = bytes(blob)
    if len(blob) < len(_MAGIC) + 1 or not blob.startswith(_MAGIC):
        raise CandidateContractError("snapshot", "bad_snapshot", "not a generator snapshot", blob[:8])
    n = blob[len(_MAGIC)]
    start = len(_MAGIC) + 1
    device_type = blob[start : start + n]
    state = blob[start + n :]
    if len(device_type) != n or not state:
        raise CandidateContractError("snapshot", "bad_snapshot", "truncated generator snapshot", len(blob))
    try:
        return device_type.decode("ascii"), state
    except UnicodeDecodeError:
        raise CandidateContractError("snapshot", "bad_snapshot", "bad device type", device_type) from None
