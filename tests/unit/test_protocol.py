"""The native wire format: every unreadable input is a typed ProtocolError, never another exception."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from candidate_scheduler import protocol as P


def test_arrays_round_trip_exactly():
    for arr in (np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.zeros((4, 4, 3), np.uint8)):
        back = P.array_from_wire(P.array_to_wire(arr))
        assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes() and back.shape == arr.shape


@pytest.mark.parametrize(
    "array, kind",
    [
        (P.Array("float32", [2, 2], b"\0" * 15), "bad_type"),  # data length does not match the shape
        (P.Array("object", [1], b"\0" * 8), "bad_type"),  # not an allowed dtype
        (P.Array("float32", [-1, 4], b""), "bad_type"),
        # dims whose int64 product wraps around: must be refused as oversize, not slip through
        (P.Array("uint8", [2**32, 2**32, 2], b""), "oversize"),
        (P.Array("float64", [2**40, 2**30], b""), "oversize"),
    ],
)
def test_bad_arrays_are_protocol_errors(array, kind):
    with pytest.raises(P.ProtocolError) as info:
        P.array_from_wire(array)
    assert info.value.kind == kind


def test_deeply_nested_payload_is_a_protocol_error_not_a_recursion_error():
    nested = b"\x81\xa1x" * 200_000 + b"\xc0"  # {"x": {"x": ...}} as an unknown field of Ping
    payload = b"\x82\xa5nonce\x01\xa1y" + nested
    with pytest.raises(P.ProtocolError) as info:
        P.decode(P.Kind.PING, payload)
    assert info.value.kind in ("bad_msgpack", "bad_type")


def test_every_kind_decodes_what_it_encodes():
    msg = P.CancelRequest("abc")
    header, payload = P.encode(P.Kind.CANCEL, msg)
    assert P.parse_header(header, P.CONTROL_KINDS) is P.Kind.CANCEL
    assert P.decode(P.Kind.CANCEL, payload) == msg
    with pytest.raises(TypeError):
        P.encode(P.Kind.CANCEL, P.Empty())
    with pytest.raises(P.ProtocolError):
        P.decode(P.Kind.CANCEL, msgspec.msgpack.encode({"request_id": 5}))
