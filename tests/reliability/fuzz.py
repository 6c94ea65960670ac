"""A seeded mutation engine for multipart ZMQ messages: frame-, header-, byte- and structure-level.

`Mutator(rnd, corpus, kinds).next()` returns (strategy, frames): a valid corpus message passed through
one randomly chosen mutation. Strategies (the name prefix is the family):

- frames:*  wrong frame counts: a frame dropped, extra frames, empty frames, a stray delimiter, 40 frames
- header:*  a bad version, an unknown or foreign kind, a header of the wrong length
- bytes:*   truncated, bit-flipped, spliced, random garbage, an empty payload, a huge payload (1-4 MB)
- struct:*  the payload decoded, changed and re-encoded: a field of the wrong type or an extreme value,
            a missing or unknown field, a wrong-typed Array (lying dtype/shape/data), deep nesting
            (10^2..10^5 levels), msgpack headers that declare huge lengths (2^32-1 elements/bytes)
- pickle:*  pickle payloads on a msgpack socket, including one whose unpickling would create a file
- valid     the corpus message unchanged (keeps the service doing real work in between)
"""

from __future__ import annotations

import os
import pickle
import random

import msgspec

from candidate_scheduler import protocol

# Values of every msgpack type, extremes included. No mid-size numbers: a huge-but-allocatable horizon
# would make the null worker allocate gigabytes, which tests the machine rather than the scheduler.
INTERESTING = [
    None, True, False, 0, -1, 1, 3, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**64 - 1, 0.5, -0.0, 1e308,
    float("nan"), float("inf"), "", "x" * 5000, "\x00", "é\u2028", b"", b"\xff" * 64, [], [None], [[]], {},
    {"": None}, {"k": [1, {"z": b""}]}, [1, 2, 3], "mean", "none", "uint8", "float32",
]
DTYPES = ["uint8", "float32", "float64", "int64", "object", "<U1", "V8", "complex128", "", "int8", "bool", "O"]
SHAPES = [[], [0], [0, 0, 3], [-1, 3], [64, 64, 3, 1, 1, 1, 1, 1, 1], [2**31, 2**31, 3], [2**62, 2**62],
          [64, 64], [1, 64, 64, 3], [64, 64, 4], [3, 64, 64], [2**63 - 1], [0, 2**64 - 1, 3], [2**63, 0]]
HUGE_HEADERS = [
    b"\xdd\xff\xff\xff\xff",  # array32, 2^32-1 elements
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xdc\xff\xff",  # array16
    b"\xde\xff\xff",  # map16
]
_MARK = b"\xfe\xed\xfa\xce-fuzz-marker-\xfe\xed\xfa\xce"


class Evil:
    """Unpickling this runs `open(path, "w")`: the file appears iff a pickle was executed."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class EvilShell:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def deep(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"\x91" * depth + b"\xc0"
    return b"\x81\xa1k" * depth + b"\xc0"


class Mutator:
    def __init__(self, rnd: random.Random, corpus: list[list[bytes]], kinds, marker_path: str):
        """corpus: valid messages ([header, payload]); kinds: every Kind (for foreign headers)."""
        self.rnd = rnd
        self.corpus = corpus
        self.kinds = list(kinds)
        self.marker_path = marker_path
        self.strategies = [
            (self.valid, 4),
            (self.frames_drop, 2), (self.frames_extra, 2), (self.frames_empty, 1), (self.frames_delim, 2),
            (self.frames_many, 1),
            (self.header_version, 2), (self.header_kind, 3), (self.header_length, 1),
            (self.bytes_truncate, 4), (self.bytes_flip, 4), (self.bytes_splice, 2), (self.bytes_garbage, 3),
            (self.bytes_empty, 1), (self.bytes_big, 1),
            (self.struct_value, 10), (self.struct_drop, 3), (self.struct_unknown, 3), (self.struct_array, 4),
            (self.struct_nest, 3), (self.struct_huge_len, 4), (self.struct_retype, 3),
            (self.pickle_payload, 3),
        ]
        self._weights = [w for _f, w in self.strategies]

    def next(self) -> tuple[str, list[bytes]]:
        fn = self.rnd.choices([f for f, _w in self.strategies], weights=self._weights)[0]
        base = [bytes(f) for f in self.rnd.choice(self.corpus)]
        name, frames = fn(base)
        if not frames:
            frames = [b""]
        return name, frames

    # -- frames --------------------------------------------------------------------------------------------
    def valid(self, m):
        return "valid", m

    def frames_drop(self, m):
        return "frames:drop", [m[self.rnd.randrange(len(m))]]

    def frames_extra(self, m):
        extra = [os.urandom(self.rnd.randrange(0, 16)) for _ in range(self.rnd.randint(1, 3))]
        pos = self.rnd.randint(0, len(m))
        return "frames:extra", m[:pos] + extra + m[pos:]

    def frames_empty(self, m):
        return "frames:empty", [b""] * self.rnd.randint(1, 4)

    def frames_delim(self, m):
        # one delimiter is legal (REQ-style); two, or one in the middle, are not
        return "frames:delimiter", self.rnd.choice([[b"", b""] + m, [m[0], b"", m[1]], m + [b""], [b""] + m])

    def frames_many(self, m):
        return "frames:many", m + [b"x"] * 38

    # -- header --------------------------------------------------------------------------------------------
    def header_version(self, m):
        v = self.rnd.choice([0, 2, 255, self.rnd.randrange(256)])
        if v == protocol.PROTOCOL_VERSION:
            v = 0
        return "header:version", [bytes([v, m[0][1]])] + m[1:]

    def header_kind(self, m):
        k = self.rnd.choice([self.rnd.randrange(256), int(self.rnd.choice(self.kinds))])
        return "header:kind", [bytes([protocol.PROTOCOL_VERSION, k])] + m[1:]

    def header_length(self, m):
        h = self.rnd.choice([b"", m[0][:1], m[0] + b"\x00", m[0] * 4, os.urandom(9)])
        return "header:length", [h] + m[1:]

    # -- bytes ---------------------------------------------------------------------------------------------
    def bytes_truncate(self, m):
        p = m[1]
        return "bytes:truncate", [m[0], p[: self.rnd.randrange(max(1, len(p)))]]

    def bytes_flip(self, m):
        p = bytearray(m[1])
        for _ in range(self.rnd.randint(1, 8)):
            if p:
                i = self.rnd.randrange(len(p))
                p[i] ^= 1 << self.rnd.randrange(8)
        return "bytes:bitflip", [m[0], bytes(p)]

    def bytes_splice(self, m):
        other = self.rnd.choice(self.corpus)[1]
        a = self.rnd.randrange(len(m[1]) + 1)
        b = self.rnd.randrange(len(other) + 1)
        return "bytes:splice", [m[0], m[1][:a] + other[b:]]

    def bytes_garbage(self, m):
        return "bytes:garbage", [m[0], os.urandom(self.rnd.choice([1, 2, 7, 64, 1000]))]

    def bytes_empty(self, m):
        return "bytes:empty", [m[0], b""]

    def bytes_big(self, m):
        n = self.rnd.choice([1 << 20, 4 << 20])
        return "bytes:big", [m[0], m[1] + os.urandom(16) * (n // 16)]

    # -- structure -------------------------------------------------------------------------------------------
    def _obj(self, m):
        try:
            return msgspec.msgpack.decode(m[1])
        except msgspec.DecodeError:
            return None

    def _paths(self, obj, prefix=()):
        out = [prefix]
        if isinstance(obj, dict):
            for k, v in obj.items():
                out += self._paths(v, prefix + (k,))
        elif isinstance(obj, list):
            for i, v in enumerate(obj[:8]):
                out += self._paths(v, prefix + (i,))
        return out

    def _set(self, obj, path, value):
        if not path:
            return value
        cur = obj
        for p in path[:-1]:
            cur = cur[p]
        cur[path[-1]] = value
        return obj

    def _enc(self, m, obj) -> bytes:
        return msgspec.msgpack.encode(obj)

    def struct_value(self, m):
        obj = self._obj(m)
        if obj is None:
            return self.bytes_flip(m)
        path = self.rnd.choice(self._paths(obj)[1:] or [()])
        value = self.rnd.choice(INTERESTING)
        return "struct:value", [m[0], self._enc(m, self._set(obj, path, value))]

    def struct_retype(self, m):
        """A field's value replaced by the same value in another msgpack type (int <-> str <-> float)."""
        obj = self._obj(m)
        if obj is None:
            return self.bytes_flip(m)
        path = self.rnd.choice(self._paths(obj)[1:] or [()])
        cur = obj
        for p in path:
            cur = cur[p]
        if isinstance(cur, bool):
            new = int(cur)
        elif isinstance(cur, int):
            new = self.rnd.choice([str(cur), float(cur), [cur], bool(cur)])
        elif isinstance(cur, float):
            new = self.rnd.choice([int(cur) if cur == cur and abs(cur) < 1e18 else 0, str(cur)])
        elif isinstance(cur, str):
            new = self.rnd.choice([cur.encode(), [cur], {"v": cur}, len(cur)])
        elif isinstance(cur, bytes):
            new = self.rnd.choice([cur[:16].hex(), list(cur[:8]), None])
        else:
            new = self.rnd.choice(INTERESTING)
        return "struct:retype", [m[0], self._enc(m, self._set(obj, path, new))]

    def struct_drop(self, m):
        obj = self._obj(m)
        dicts = [p for p in self._paths(obj) if isinstance(self._get(obj, p), dict) and self._get(obj, p)]
        if not dicts:
            return self.bytes_truncate(m)
        d = self._get(obj, self.rnd.choice(dicts))
        d.pop(self.rnd.choice(list(d)))
        return "struct:drop-field", [m[0], self._enc(m, obj)]

    def struct_unknown(self, m):
        obj = self._obj(m)
        dicts = [p for p in self._paths(obj) if isinstance(self._get(obj, p), dict)]
        if not dicts:
            return self.bytes_garbage(m)
        d = self._get(obj, self.rnd.choice(dicts))
        d[self.rnd.choice(["__class__", "x", "", "request_id ", "🙂"])] = self.rnd.choice(INTERESTING)
        return "struct:unknown-field", [m[0], self._enc(m, obj)]

    def struct_array(self, m):
        """An Array ({dtype, shape, data}) whose dtype, shape or data lies."""
        obj = self._obj(m)
        arrays = [p for p in self._paths(obj) if isinstance(self._get(obj, p), dict) and {"dtype", "shape", "data"} <= set(self._get(obj, p))]
        if not arrays:
            return self.struct_value(m)
        a = self._get(obj, self.rnd.choice(arrays))
        what = self.rnd.choice(["dtype", "shape", "data", "all"])
        if what in ("dtype", "all"):
            a["dtype"] = self.rnd.choice(DTYPES)
        if what in ("shape", "all"):
            a["shape"] = self.rnd.choice(SHAPES)
        if what in ("data", "all"):
            data = a["data"] if isinstance(a["data"], bytes) else b""
            a["data"] = self.rnd.choice([b"", data[:-1], data + b"\x00", data[: len(data) // 2]])
        return "struct:array-lie", [m[0], self._enc(m, obj)]

    def struct_nest(self, m):
        depth = self.rnd.choice([100, 1000, 10_000, 100_000])
        kind = self.rnd.choice(["array", "map"])
        obj = self._obj(m)
        if obj is None or not isinstance(obj, dict) or self.rnd.random() < 0.3:
            return "struct:deep-nesting", [m[0], deep(depth, kind)]
        path = self.rnd.choice(self._paths(obj)[1:] or [()])
        enc = self._enc(m, self._set(obj, path, _MARK))
        marker = msgspec.msgpack.encode(_MARK)
        return "struct:deep-nesting", [m[0], enc.replace(marker, deep(depth, kind), 1)]

    def struct_huge_len(self, m):
        header = self.rnd.choice(HUGE_HEADERS)
        tail = os.urandom(self.rnd.choice([0, 1, 8, 100]))
        obj = self._obj(m)
        if obj is None or not isinstance(obj, dict) or self.rnd.random() < 0.3:
            return "struct:huge-length", [m[0], header + tail]
        path = self.rnd.choice(self._paths(obj)[1:] or [()])
        enc = self._enc(m, self._set(obj, path, _MARK))
        marker = msgspec.msgpack.encode(_MARK)
        return "struct:huge-length", [m[0], enc.replace(marker, header + tail, 1)]

    def pickle_payload(self, m):
        obj = self._obj(m)
        choice = self.rnd.randrange(4)
        if choice == 0:
            payload = pickle.dumps(Evil(self.marker_path), protocol=self.rnd.randint(0, 5))
        elif choice == 1:
            payload = pickle.dumps(EvilShell(self.marker_path), protocol=self.rnd.randint(0, 5))
        elif choice == 2:
            payload = pickle.dumps(obj, protocol=self.rnd.randint(0, 5))
        else:  # the evil object hidden inside the real structure
            payload = pickle.dumps({"payload": obj, "x": Evil(self.marker_path)}, protocol=4)
        return "pickle:payload", [m[0], payload]

    @staticmethod
    def _get(obj, path):
        cur = obj
        for p in path:
            cur = cur[p]
        return cur
