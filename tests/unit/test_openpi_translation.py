"""The openpi front's pure parts: the msgpack-numpy decoder, observation -> SubmitRequest, result ->
reply, and the command-line defaults that travel from `serve` to the front."""

from __future__ import annotations

import argparse
import math

import msgpack
import numpy as np
import pytest

from candidate_scheduler import convert, protocol
from candidate_scheduler.service.client import Result
from candidate_scheduler.service.openpi import launch, observation
from candidate_scheduler.service.openpi.msgpack_numpy import WireError, packb, unpackb
from candidate_scheduler.service.openpi.observation import FrontDefaults, ObservationError, translate

IMAGE = np.random.default_rng(3).integers(0, 256, size=(20, 24, 3), dtype=np.uint8)


def openpi_array(arr: np.ndarray) -> dict:
    """An array exactly as openpi_client.msgpack_numpy.pack_array writes it."""
    return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": arr.shape}


# ---- msgpack-numpy --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "int64", ">i4", "float32", "<f8", "float16", "bool"])
def test_openpi_arrays_decode_exactly(dtype):
    arr = (np.arange(12) % 2 if dtype == "bool" else np.arange(12)).astype(dtype).reshape(3, 4)
    out = unpackb(msgpack.packb({"x": openpi_array(arr), "s": {b"__npgeneric__": True, b"data": 7, b"dtype": "<i8"}}))
    assert out["x"].dtype == arr.dtype and out["x"].shape == (3, 4) and out["x"].tobytes() == arr.tobytes()
    assert out["s"] == 7 and type(out["s"]) is int


def test_our_replies_use_openpis_format():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = msgpack.unpackb(packb({"actions": arr, "n": np.int64(3)}))
    assert raw["actions"] == {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": "<f4", b"shape": [2, 3]}
    assert raw["n"] == 3


@pytest.mark.parametrize("frame, needle", [
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}}), "'|O' is not accepted"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<c8", b"shape": [1]}}), "not accepted"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|V8", b"shape": [1]}}), "not accepted"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<M8[s]", b"shape": [1]}}), "not accepted"),
    # `$` matched before a trailing newline, and numpy's TypeError escaped as no WireError
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": "<f4\n", b"shape": [1]}}), "not accepted"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 5, b"dtype": "|u1", b"shape": [2, 3]}}), "needs 6"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|u1", b"shape": [-1]}}), "shape"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|u1", b"shape": [True]}}), "shape"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|u1", b"shape": [2**40, 2**40, 0]}}), "too large"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|u1", b"shape": [2**62, 2**62]}}), "needs"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": "text", b"dtype": "|u1", b"shape": [4]}}), "bytes"),
    (msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|u1", b"shape": [0], b"x": 1}}), "exactly the keys"),
    (msgpack.packb({"x": {b"__npgeneric__": True, b"data": "7", b"dtype": "<i8"}}), "cannot hold"),
    (msgpack.packb({"x": msgpack.ExtType(1, b"\0")}), "extension type 1"),
    (msgpack.packb({1: 2}), "msgpack"),  # map keys must be strings
    (msgpack.packb({"a": 1}) + b"\x01", "msgpack"),  # trailing bytes
    (msgpack.packb({"a": "x" * 50})[:-5], "msgpack"),  # truncated
    (b"\x91" * 200_000, "msgpack"),  # nesting deeper than any decoder stack
    (b"\xc1", "msgpack"),
])
def test_hostile_frames_are_wire_errors(frame, needle):
    with pytest.raises(WireError) as info:
        unpackb(frame)
    assert needle in str(info.value)


# ---- images -----------------------------------------------------------------------------------------


def test_image_layouts_and_ranges_are_exact():
    every = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    assert observation.to_uint8_hwc(every, "k", "0,1") is not None
    assert observation.to_uint8_hwc(every.transpose(2, 0, 1), "k", "0,1").tobytes() == every.tobytes()
    for dtype in (np.float16, np.float32, np.float64):
        unit = every.astype(dtype) / dtype(255)
        assert observation.to_uint8_hwc(unit, "k", "0,1").tobytes() == every.tobytes(), dtype
        signed = every.astype(dtype) / dtype(127.5) - dtype(1)
        assert observation.to_uint8_hwc(signed, "k", "-1,1").tobytes() == every.tobytes(), dtype
        assert observation.to_uint8_hwc(unit.transpose(2, 0, 1), "k", "0,1").tobytes() == every.tobytes()


@pytest.mark.parametrize("image, float_range, needle", [
    (IMAGE.astype(np.float32), "0,1", "send the image as uint8"),
    (IMAGE.astype(np.float32) / 127.5 - 1, "0,1", "--openpi-float-range=-1,1"),
    (IMAGE.astype(np.float32) * 2, "-1,1", "in [-1,1]"),
    (np.full((16, 16, 3), np.nan, np.float32), "0,1", "NaN"),
    (IMAGE.astype(np.int64), "0,1", "dtype int64"),
    (IMAGE[:, :, 0], "0,1", "one image"),
    (np.zeros((16, 16, 4), np.uint8), "0,1", "RGB"),
    (IMAGE[None], "0,1", "one image"),
    ("a path.png", "0,1", "must be an array"),
])
def test_ambiguous_or_wrong_images_are_refused(image, float_range, needle):
    with pytest.raises(ObservationError) as info:
        observation.to_uint8_hwc(image, "observation/image", float_range)
    assert needle in str(info.value) and "observation/image" in str(info.value)


def test_image_key_order():
    find = observation.find_image
    assert find({"image": 1, "observation/image": 2}, None) == "observation/image"
    assert find({"image": 1, "observation.images.top": 2}, None) == "image"
    assert find({"observation.images.top": 2, "observation.state": 0}, None) == "observation.images.top"
    with pytest.raises(ObservationError, match="--openpi-image-key"):
        find({"observation.images.top": 2, "observation.images.wrist": 3}, None)
    assert find({"observation.images.top": 2, "observation.images.wrist": 3}, "observation.images.wrist") == \
        "observation.images.wrist"
    with pytest.raises(ObservationError, match="'cam_high'"):
        find({"observation/image": 1}, "cam_high")
    with pytest.raises(ObservationError, match="no image"):
        find({"prompt": "x", "observation/wrist_image": 1}, None)


# ---- translation ----------------------------------------------------------------------------------


def test_unset_defaults_are_the_native_protocols():
    call = translate({"observation/image": IMAGE, "seed": 5}, FrontDefaults(), "r1")
    native = protocol.SubmitRequest(request_id="r1", images=protocol.array_to_wire(IMAGE), seed=5, api="openpi")
    assert call.submit == native
    assert call.ignored_keys == () and not call.wants_candidates


def test_flags_then_observation_fields():
    defaults = FrontDefaults(prompt="stack", seed=11, candidates={"count": 3, "reducer": "median"},
                             sampling={"steps": 2, "horizon": 8})
    obs = {"observation/image": IMAGE, "observation/state": np.zeros(8), "observation/wrist_image": IMAGE,
           "candidates": {"reducer": "medoid", "seeds": np.array([4, 5, 6])}, "sampling": {"horizon": 4}}
    call = translate(obs, defaults, "r2")
    s = call.submit
    assert (s.prompt, s.seed) == ("stack", 11)
    assert (s.candidates.count, s.candidates.reducer, s.candidates.seeds) == (3, "medoid", [4, 5, 6])
    resolved = convert.sampling_from_wire(s.sampling)  # unset embodiment: the native defaults
    assert (resolved.steps, resolved.horizon, resolved.raw_action_dim, resolved.domain_id) == (2, 4, 7, 0)
    assert call.ignored_keys == ("observation/state", "observation/wrist_image")


def test_deadline_and_elastic_count_travel():
    call = translate({"image": IMAGE, "deadline_s": 0.25, "candidates": {"count": 8, "min_count": 2}},
                     FrontDefaults(deadline_s=2.0), "r")
    assert call.submit.deadline_s == 0.25 and call.submit.candidates.min_count == 2
    assert translate({"image": IMAGE}, FrontDefaults(deadline_s=2.0), "r").submit.deadline_s == 2.0
    assert translate({"image": IMAGE}, FrontDefaults(), "r").submit.deadline_s is None
    assert call.submit.api == "openpi"  # counted as openpi's clients' (groups_received_total{api})
    for bad in (0, -1.0, "1", True, float("nan"), float("inf")):
        with pytest.raises(ObservationError, match="deadline_s"):
            translate({"image": IMAGE, "deadline_s": bad}, FrontDefaults(), "r")


def test_fresh_seeds_per_call():
    seeds = {translate({"image": IMAGE}, FrontDefaults(), "r").submit.seed for _ in range(20)}
    assert len(seeds) == 20 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("extra, needle", [
    ({"prompt": b"bytes"}, "prompt must be a string"),
    ({"prompt": "x" * (protocol.MAX_PROMPT_CHARS + 1)}, "at most"),
    ({"seed": True}, "seed must be an int"),
    ({"seed": 2**64}, "[0, 2**64)"),
    ({"seed": 1.0}, "seed must be an int"),
    ({"candidates": 4}, "candidates must be a map"),
    ({"candidates": {"count": 2.0}}, "candidates.count"),
    ({"candidates": {"return_candidates": 1}}, "candidates.return_candidates"),
    ({"sampling": {"height": "64"}}, "sampling.height"),
    ({"sampling": {"noise_level": 0.5}}, "rollouts are not served"),
    ({"sampling": {"bogus": 1}}, "sampling.bogus is not a field"),
])
def test_bad_fields_name_themselves(extra, needle):
    with pytest.raises(ObservationError) as info:
        translate({"observation/image": IMAGE, **extra}, FrontDefaults(), "r")
    assert needle in str(info.value)


def test_domain_name_travels_as_the_native_protocol_carries_it():
    call = translate({"image": IMAGE, "sampling": {"domain_name": "droid_lerobot"}}, FrontDefaults(), "r")
    native = protocol.SubmitRequest(request_id="r", images=protocol.array_to_wire(IMAGE), seed=call.submit.seed,
                                    sampling=protocol.SamplingMsg(domain_name="droid_lerobot"), api="openpi")
    assert call.submit == native
    flagged = FrontDefaults(sampling={"domain_name": "umi"})
    assert translate({"image": IMAGE}, flagged, "r").submit.sampling.domain_name == "umi"
    assert flagged.full_sampling()["domain_name"] == "umi"  # what the metadata says


def test_bad_server_defaults_fail_at_start():
    with pytest.raises(ValueError):
        FrontDefaults(candidates={"count": "3"})
    with pytest.raises(ValueError):
        FrontDefaults(float_range="0,255")


# ---- replies ----------------------------------------------------------------------------------------


def _result(status="done", **kw) -> Result:
    base = dict(request_id="r", status=status, action=np.ones((4, 7), np.float32),
                candidates=np.ones((2, 4, 7), np.float32), candidate_seeds=[5, 9],
                metrics={"denoise_s": 0.25, "admission_mode": "atomic", "microbatches": 1, "nested": {"a": 1}})
    return Result(**{**base, **kw})


def test_reply_fields():
    call = translate({"image": IMAGE, "seed": 5, "candidates": {"count": 2}, "state": 1}, FrontDefaults(), "r")
    out = observation.reply(call, _result(), 0.5, prev_total_s=0.75)
    assert out["actions"].dtype == np.float32 and out["actions"].shape == (4, 7)
    assert "candidates" not in out  # not asked for
    assert out["candidate_seeds"] == [5, 9] and out["seed"] == 5 and out["served_count"] == 2
    assert math.isclose(out["server_timing"]["infer_ms"], 500) and math.isclose(out["server_timing"]["prev_total_ms"], 750)
    assert math.isclose(out["server_timing"]["scheduler_denoise_ms"], 250)
    assert out["scheduler_metrics"] == {"admission_mode": "atomic", "microbatches": 1}
    assert out["ignored_keys"] == ["state"]
    elastic = observation.reply(call, _result(served_count=1), 0.1)
    assert elastic["served_count"] == 1
    asked = translate({"image": IMAGE, "candidates": {"count": 2, "return_candidates": True}}, FrontDefaults(), "r")
    assert observation.reply(asked, _result(), 0.1)["candidates"].shape == (2, 4, 7)


@pytest.mark.parametrize("status", ["invalid", "rejected", "failed", "expired", "overloaded", "cancelled"])
def test_results_that_are_not_done_are_errors(status):
    call = translate({"image": IMAGE}, FrontDefaults(), "r")
    with pytest.raises(observation.ResultError) as info:
        observation.reply(call, _result(status, action=None, error="it broke", error_code="worker_failed"), 0.1)
    assert str(info.value) == f"the scheduler answered {status}: worker_failed: it broke"


# ---- flags ------------------------------------------------------------------------------------------


def test_serve_flags_reach_the_front_unchanged():
    serve = argparse.ArgumentParser()
    launch.add_openpi_arguments(serve)
    args = serve.parse_args(["--openpi-port", "0", "--openpi-count", "4", "--openpi-reducer", "medoid",
                             "--openpi-return-candidates", "--openpi-float-range=-1,1", "--openpi-guidance-scale", "2.5",
                             "--openpi-prompt", "-- a prompt with dashes", "--openpi-max-frame-bytes", "1000"])
    argv = launch.defaults_argv(args)
    front = launch.build_parser().parse_args(["--scheduler-request", "tcp://127.0.0.1:1", *argv])
    d = launch.front_defaults(front)
    assert d.candidates == {"count": 4, "reducer": "medoid", "return_candidates": True}
    assert d.sampling == {"guidance_scale": 2.5} and d.float_range == "-1,1" and d.prompt == "-- a prompt with dashes"
    assert front.max_frame_bytes == 1000
    assert launch.defaults_argv(serve.parse_args([])) == []
