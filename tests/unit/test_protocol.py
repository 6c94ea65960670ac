"""The native wire format: every unreadable input is a typed ProtocolError, never another exception."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from candidate_scheduler import protocol


def test_arrays_round_trip_exactly():
    for arr in (np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.zeros((4, 4, 3), np.uint8)):
        back = protocol.array_from_wire(protocol.array_to_wire(arr))
        assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes() and back.shape == arr.shape


@pytest.mark.parametrize(
    "array, kind",
    [
        (protocol.Array("float32", [2, 2], b"\0" * 15), "bad_type"),  # data length does not match the shape
        (protocol.Array("object", [1], b"\0" * 8), "bad_type"),  # not an allowed dtype
        (protocol.Array("float32", [-1, 4], b""), "bad_type"),
        # dims whose int64 product wraps around: must be refused as oversize, not slip through
        (protocol.Array("uint8", [2**32, 2**32, 2], b""), "oversize"),
        (protocol.Array("float64", [2**40, 2**30], b""), "oversize"),
        # no bytes, so no size to refuse, but a dimension numpy cannot make (it raised a plain ValueError,
        # and the SUBMIT holding it got no answer)
        (protocol.Array("uint8", [0, 2**64 - 1, 3], b""), "bad_type"),
        (protocol.Array("float32", [2**63, 0], b""), "bad_type"),
    ],
)
def test_bad_arrays_are_protocol_errors(array, kind):
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.array_from_wire(array)
    assert info.value.kind == kind


def test_deeply_nested_payload_is_a_protocol_error_not_a_recursion_error():
    nested = b"\x81\xa1x" * 200_000 + b"\xc0"  # {"x": {"x": ...}} as an unknown field of Ping
    payload = b"\x82\xa5nonce\x01\xa1y" + nested
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.decode(protocol.Kind.PING, payload)
    assert info.value.kind in ("bad_msgpack", "bad_type")


def test_every_kind_decodes_what_it_encodes():
    msg = protocol.CancelRequest("abc")
    header, payload = protocol.encode(protocol.Kind.CANCEL, msg)
    assert protocol.parse_header(header, protocol.CONTROL_KINDS) is protocol.Kind.CANCEL
    assert protocol.decode(protocol.Kind.CANCEL, payload) == msg
    with pytest.raises(TypeError):
        protocol.encode(protocol.Kind.CANCEL, protocol.Empty())
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(protocol.Kind.CANCEL, msgspec.msgpack.encode({"request_id": 5}))


def test_decode_frames_reads_exactly_header_and_payload():
    frames = protocol.encode(protocol.Kind.PONG, protocol.Pong(7))
    assert protocol.decode_frames(frames, {protocol.Kind.PONG}) == (protocol.Kind.PONG, protocol.Pong(7))
    for bad in (frames[:1], [*frames, b""], []):
        with pytest.raises(protocol.ProtocolError) as info:
            protocol.decode_frames(bad, {protocol.Kind.PONG})
        assert info.value.kind == "bad_frames"
    with pytest.raises(protocol.ProtocolError):  # a kind this reader does not take
        protocol.decode_frames(frames, {protocol.Kind.RESULT})


def test_the_leaving_handshake_round_trips_and_stays_on_its_sockets():
    for kind, msg, side in ((protocol.Kind.LEAVING, protocol.LeavingMsg("w", 25.0), protocol.WORKER_KINDS),
                            (protocol.Kind.LEFT, protocol.LeftMsg("w", "finished"), protocol.WORKER_KINDS),
                            (protocol.Kind.LEAVE_ACK, protocol.LeaveAckMsg([3, 4]), {protocol.Kind.LEAVE_ACK})):
        header, payload = protocol.encode(kind, msg)
        assert protocol.parse_header(header, side) is kind and protocol.decode(kind, payload) == msg
    with pytest.raises(protocol.ProtocolError):  # a client may not say a worker is leaving
        protocol.parse_header(protocol.header(protocol.Kind.LEAVING), protocol.REQUEST_KINDS)
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(protocol.Kind.LEAVING, msgspec.msgpack.encode({"worker_id": "w", "grace_s": "soon"}))


def test_a_worker_report_keeps_only_what_a_worker_can_measure():
    """A count past 2**53 is dropped with the other nonsense: it was kept, ended up as an int beyond 2**64
    in a reply's metrics, and the reply could not be encoded."""
    from candidate_scheduler import convert

    msg = protocol.BatchResultMsg("w", 1, [], {"transformer_forwards": 1e20, "forward_s": 0.5, "steps": 4,
                                               "bad": float("nan"), "neg": -1.0, "flag": True})
    assert convert.worker_result_from_wire(msg).report == {"forward_s": 0.5, "steps": 4}
