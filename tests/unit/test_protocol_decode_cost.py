"""What decoding a hostile message costs the scheduler's one loop thread.

A list or map field that no valid message fills past a few hundred entries was unbounded: a 60 MB
HEARTBEAT `running` list or SUBMIT `prompt` list decoded to ~460 MB of Python objects in 0.5-1 s, and a
COMPAT_REPORT of 7.5 M distinct names took 4.4 s to decode and 7.5 s more of metric updates -- past
the workers' 3 s heartbeat timeout, so the tick after it declared every worker lost. Each such field
now has a length bound, checked by msgspec from the container's header before any entry is built:
the message is a ProtocolError (an ERROR reply on a client socket), at no cost. The bounds sit far
above what a valid message holds, so a client's mistake still gets the field-level answer it got."""

from __future__ import annotations

import time
import tracemalloc

import msgspec
import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.core.request import MAX_CANDIDATES, MAX_OBSERVATIONS_PER_GROUP

K = protocol.Kind
N = 2_000_000  # entries: a 2-16 MB message, far under MAX_MESSAGE_BYTES
IMAGE = {"dtype": "uint8", "shape": [16, 16, 3], "data": bytes(16 * 16 * 3)}


def _submit(**fields) -> dict:
    return {"request_id": "r", "images": IMAGE, **fields}


HOSTILE = {
    "submit.prompt": (K.SUBMIT, _submit(prompt=[""] * N)),
    "submit.seeds": (K.SUBMIT, _submit(candidates={"seeds": [0] * N})),
    "submit.return_step_indices": (K.SUBMIT, _submit(sampling={"return_step_indices": [0] * N})),
    "submit.images.shape": (K.SUBMIT, _submit(images={**IMAGE, "shape": [1] * N})),
    "compat_report.requests": (K.COMPAT_REPORT, {"requests": {str(i): 1 for i in range(N // 4)}}),
    "compat_report.errors": (K.COMPAT_REPORT, {"errors": {str(i): 1 for i in range(N // 4)}}),
    "heartbeat.running": (K.HEARTBEAT, {"worker_id": "w", "running": [0] * N}),
    "heartbeat.forwards": (K.HEARTBEAT, {"worker_id": "w", "forwards": [[1, 0.1, "l"]] * (N // 4)}),
    "heartbeat.cache": (K.HEARTBEAT, {"worker_id": "w", "cache": {str(i): 1 for i in range(N // 4)}}),
    "register.profile": (K.REGISTER, {"worker_id": "w", "capability": {}, "capacity": 1,
                                      "profile": [["l", 1, 0.1]] * (N // 4)}),
    "register.capability": (K.REGISTER, {"worker_id": "w", "capability": {str(i): 1 for i in range(N // 4)},
                                         "capacity": 1}),
    "batch_result.outputs": (K.BATCH_RESULT, {"worker_id": "w", "batch_id": 1,
                                              "outputs": [{"request_id": "", "status": ""}] * (N // 4)}),
    "batch_result.candidate_ids": (K.BATCH_RESULT, {"worker_id": "w", "batch_id": 1, "outputs": [
        {"request_id": "", "status": "ok", "candidate_ids": [0] * N}]}),
    "batch_result.report": (K.BATCH_RESULT, {"worker_id": "w", "batch_id": 1, "outputs": [],
                                             "report": {str(i): 1 for i in range(N // 4)}}),
    "give_back.batch_ids": (K.GIVE_BACK, {"worker_id": "w", "batch_ids": [0] * N}),
    "batch_result.rollout": (K.BATCH_RESULT, {"worker_id": "w", "batch_id": 1, "outputs": [
        {"request_id": "", "status": "ok", "rollout": {str(i): IMAGE for i in range(N // 64)}}]}),
}


@pytest.fixture(scope="module")
def payloads() -> dict[str, tuple[protocol.Kind, bytes]]:
    return {name: (kind, msgspec.msgpack.encode(obj)) for name, (kind, obj) in HOSTILE.items()}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_an_oversized_container_is_refused_before_it_is_built(payloads, name):
    kind, payload = payloads[name]
    assert len(payload) < protocol.MAX_MESSAGE_BYTES
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(protocol.ProtocolError) as info:
            protocol.decode(kind, payload)
        took = time.perf_counter() - started
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.kind == "bad_type" and "length" in str(info.value)
    assert peak < 1 << 20, f"{name}: decoding allocated {peak} bytes for a {len(payload)}-byte message"
    assert took < 0.5, f"{name}: {took:.3f} s"  # microseconds: generous for a loaded machine


def test_the_largest_valid_values_still_decode():
    """The bounds are far from anything valid: a group of the most observations and candidates, every
    step returned, and a worker's full heartbeat and report."""
    image = {**IMAGE, "shape": [MAX_OBSERVATIONS_PER_GROUP, 1, 1, 3], "data": bytes(MAX_OBSERVATIONS_PER_GROUP * 3)}
    sub = protocol.decode(K.SUBMIT, msgspec.msgpack.encode(_submit(
        images=image, batched=True, prompt=["p"] * MAX_OBSERVATIONS_PER_GROUP,
        candidates={"count": MAX_CANDIDATES, "seeds": list(range(MAX_CANDIDATES))},
        sampling={"steps": 1000, "return_step_indices": list(range(1000))})))
    assert len(sub.prompt) == MAX_OBSERVATIONS_PER_GROUP and len(sub.candidates.seeds) == MAX_CANDIDATES
    beat = protocol.decode(K.HEARTBEAT, msgspec.msgpack.encode(
        {"worker_id": "w", "running": list(range(1024)), "forwards": [[8, 0.1, "64x64h16f5"]] * 1024,
         "cache": {"text_hits": 1, "bytes": 2**40}}))
    assert len(beat.running) == len(beat.forwards) == 1024
    result = protocol.decode(K.BATCH_RESULT, msgspec.msgpack.encode({
        "worker_id": "w", "batch_id": 1, "report": {f"k{i}": i for i in range(32)},
        "outputs": [{"request_id": str(i), "status": "ok", "candidate_ids": list(range(MAX_CANDIDATES))}
                    for i in range(256)]}))
    assert len(result.outputs) == 256


def test_a_bad_count_inside_the_bounds_still_gets_its_field_level_answer():
    """300 seeds for a count of 2: still a SUBMIT the engine answers `invalid` naming the field."""
    from candidate_scheduler import convert
    from candidate_scheduler.core.errors import CandidateContractError
    from candidate_scheduler.core.request import validate

    msg = protocol.decode(K.SUBMIT, msgspec.msgpack.encode(_submit(candidates={"count": 2, "seeds": [1] * 300})))
    with pytest.raises(CandidateContractError) as info:
        validate(convert.submission_from_wire(msg))
    assert info.value.field == "seeds"
    assert np.asarray(convert.submission_from_wire(msg).images).shape == (16, 16, 3)
