"""openpi msgpack-numpy frames the front must refuse with a typed WireError (never an internal error,
never gigabytes of memory), and the string arrays openpi's own clients send that it must read."""

from __future__ import annotations

import time
import tracemalloc

import msgpack
import numpy as np
import pytest

from candidate_scheduler.service.openpi import msgpack_numpy, observation


def _scalar(data, dtype: str) -> dict:
    return {b"__npgeneric__": True, b"data": data, b"dtype": dtype}


@pytest.mark.parametrize("data,dtype", [(300, "|u1"), (-1, "<u8"), (-129, "|i1"), (2**64 - 1, "<i8")])
def test_a_numpy_scalar_out_of_its_dtypes_range_is_a_wire_error(data, dtype):
    # numpy raises OverflowError here, which the front answered as "internal error" (and logged a traceback)
    frame = msgpack.packb({"observation/image": b"", "seed": _scalar(data, dtype)})
    with pytest.raises(msgpack_numpy.WireError, match="scalar cannot hold") as exc:
        msgpack_numpy.unpackb(frame)
    assert exc.value.kind == "bad_array"


def _openpi_string_array(text: str, order: str = "<", shape: tuple = ()) -> dict:
    # what openpi_client.msgpack_numpy packs for np.array(text): tobytes(), dtype.str, shape
    arr = np.array(text).astype(f"{order}U{max(len(text), 1)}").reshape(shape)
    return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": list(shape)}


@pytest.mark.parametrize("order,shape", [("<", ()), (">", ()), ("<", (1,))])
def test_a_prompt_sent_as_a_numpy_string_array_is_read_as_openpi_reads_it(order, shape):
    """openpi's policies take `prompt.item()` of a non-str prompt (a LeRobot task is often np.array(str));
    the decoder refused every unicode dtype, so observation._prompt's 0-d string branch was never reached."""
    image = np.zeros((8, 8, 3), np.uint8)
    image_map = {b"__ndarray__": True, b"data": image.tobytes(), b"dtype": "|u1", b"shape": [8, 8, 3]}
    prompt = _openpi_string_array("pick up the cup", order, shape)
    frame = msgpack.packb({"observation/image": image_map, "prompt": prompt})
    call = observation.translate(msgpack_numpy.unpackb(frame), observation.FrontDefaults(), "r1")
    assert call.submit.prompt == "pick up the cup"


@pytest.mark.parametrize("bad", [(0x110000).to_bytes(4, "little"), (0xD800).to_bytes(4, "little")])
def test_a_string_array_that_is_not_valid_text_is_a_wire_error(bad):
    frame = msgpack.packb({"prompt": {b"__ndarray__": True, b"data": bad, b"dtype": "<U1", b"shape": []}})
    with pytest.raises(msgpack_numpy.WireError, match="not valid <U1 text"):
        msgpack_numpy.unpackb(frame)


@pytest.mark.parametrize("element", [b"\x90", b"\x80", b"\xa2ab"])
def test_a_frame_of_millions_of_tiny_objects_is_refused_before_it_is_built(element):
    """Each byte of msgpack can be an object: 8 MB of empty lists decoded to ~550 MB of Python lists in
    3 s (a 32 MiB frame, the default limit, to over 2 GB). The count is refused up front, cheaply."""
    n = 8_000_000 // len(element)
    frame = b"\xdd" + n.to_bytes(4, "big") + element * n
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(msgpack_numpy.WireError, match="more than") as exc:
            msgpack_numpy.unpackb(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.kind == "too_many_objects"
    assert peak < 16 * 1024 * 1024, peak
    assert time.monotonic() - started < 2.0


def test_real_observations_and_lying_headers_still_decode_as_before():
    image = np.arange(64 * 48 * 3, dtype=np.uint8).reshape(64, 48, 3)
    obs = {"observation/image": image, "observation/state": np.zeros(14, np.float32), "prompt": "go",
           "seed": 7, "candidates": {"count": 4, "seeds": list(range(4))}, "joints": [0.5] * 1000}
    back = msgpack_numpy.unpackb(msgpack_numpy.packb(obs))
    assert back["observation/image"].tobytes() == image.tobytes() and back["joints"] == [0.5] * 1000
    assert back["candidates"] == {"count": 4, "seeds": [0, 1, 2, 3]}
    # an array header that promises more than the frame holds is still msgpack's own error
    with pytest.raises(msgpack_numpy.WireError) as exc:
        msgpack_numpy.unpackb(b"\xdd\xff\xff\xff\xff\x90")
    assert exc.value.kind == "bad_msgpack"
    with pytest.raises(msgpack_numpy.WireError, match="msgpack") as exc:
        msgpack_numpy.unpackb(b"\x91" * 5000)
    assert exc.value.kind == "too_deep"
    nested = {"observation/image": b"", "deep": 1}
    for _ in range(msgpack_numpy.MAX_DEPTH - 1):
        nested = {"a": nested}
    assert msgpack_numpy.unpackb(msgpack.packb(nested))  # as deep as allowed


@pytest.mark.parametrize("field", ["seed", "deadline_s"])
@pytest.mark.parametrize("container", [b"\x91", b"\x81\xa1a"])  # [x] and {"a": x}
def test_a_deeply_nested_field_is_refused_not_an_internal_error(field, container):
    """A list or map nested 1000 deep decoded (msgpack's own limit is deeper), and the error that quotes the
    field's value hit Python's recursion limit: RecursionError, which the front answers "internal error"."""
    image = {b"__ndarray__": True, b"data": bytes(8 * 8 * 3), b"dtype": "|u1", b"shape": [8, 8, 3]}
    head = msgpack.packb({"observation/image": image})
    frame = bytes([head[0] + 1]) + head[1:] + msgpack.packb(field) + container * 1000 + b"\x01"
    with pytest.raises((msgpack_numpy.WireError, observation.ObservationError)):
        observation.translate(msgpack_numpy.unpackb(frame), observation.FrontDefaults(), "r")
