"""A pickle's memo index is not a size: a few bytes must not make the bridge allocate gigabytes.

CPython's C unpickler keeps the memo as an array and, on PUT / LONG_BINPUT with index i, grows it to
2*i slots and zeroes them. A 9-byte pickle ``PROTO 4; NONE; LONG_BINPUT 2**30; STOP`` therefore made
`safe_loads` allocate and touch 16 GiB (2**31 would be 32 GiB on a large host), and payloads of up to
512 bytes are decoded inside the bridge's receive loop, so the loop stalled for the whole allocation.
A pickler only ever numbers its memo 0, 1, 2, ...: an index past the payload's length is never legitimate."""

from __future__ import annotations

import pickle
import struct

import pytest

from candidate_scheduler.compat.errors import RefusedPickle
from candidate_scheduler.compat.unpickle import safe_loads

# 2**24 keeps the failing (unfixed) run cheap -- 256 MiB -- while being far past any memo index a
# 9-byte pickle can legitimately use
BIG = 1 << 24


@pytest.mark.parametrize("payload", [
    b"\x80\x04N" + b"r" + struct.pack("<I", BIG) + b".",  # LONG_BINPUT
    b"Np" + str(BIG).encode() + b"\n.",  # protocol 0 PUT
], ids=["long_binput", "put"])
def test_huge_memo_index_is_refused(payload):
    with pytest.raises(RefusedPickle):
        safe_loads(payload)


def test_memo_still_works_for_real_pickles():
    shared = ["x"]
    for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
        obj = safe_loads(pickle.dumps([shared, shared, {"k": shared}], proto))
        assert obj == [["x"], ["x"], {"k": ["x"]}]
        assert obj[0] is obj[1] is obj[2]["k"]
    # protocols 1-3 number a memo past 255 with LONG_BINPUT: legitimate, and kept
    many = [[i] for i in range(300)]
    obj = safe_loads(pickle.dumps([many, many], 2))
    assert obj[0] is obj[1] and obj[0][299] == [299]


def test_declared_bytearray_size_past_the_payload_is_refused():
    # BYTEARRAY8 (protocol 5) declares its size before its bytes; a reader that makes the buffer first
    # would zero 8 GiB for this 20-byte pickle
    with pytest.raises(RefusedPickle):
        safe_loads(b"\x80\x05\x96" + struct.pack("<Q", 1 << 33) + b"x.")


def test_bytearrays_still_load():
    for proto in (2, 5):
        assert safe_loads(pickle.dumps([bytearray(b"abc"), bytearray()], proto)) == [bytearray(b"abc"), bytearray()]
    with pytest.raises(RefusedPickle):  # truncated
        safe_loads(b"\x80\x05\x96" + struct.pack("<Q", 5) + b"ab")
