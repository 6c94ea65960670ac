"""openpi's msgpack-numpy wire format, decoded without trust.

`openpi_client.msgpack_numpy` (0.1.2) packs an ndarray as the map
``{b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": arr.shape}`` and a
numpy scalar as ``{b"__npgeneric__": True, b"data": scalar.item(), b"dtype": scalar.dtype.str}``, and
refuses object, void and complex dtypes when packing. Its decoder trusts whatever dtype string it is
given; this one does not: only plain numeric dtypes (bool, signed and unsigned ints, floats) and
unicode strings (a prompt sent as ``np.array("pick up")``, which openpi's policies read with
``.item()``) become arrays, the byte count must match the shape exactly, strings must be valid
UTF-32, and any msgpack extension type is refused. There is no pickle anywhere on this path.

A frame decodes to at most `MAX_OBJECTS` msgpack objects, nested at most `MAX_DEPTH` deep, checked
before any is built: each byte of a frame can be an object (an empty list costs ~60 bytes of Python),
so without a count a 32 MiB frame could cost the front gigabytes. Real observations are a few hundred
objects a few levels deep; their bulk is the arrays' bytes.

`packb` writes the same format, so `openpi_client.msgpack_numpy.unpackb` reads our replies as it
reads openpi's own server's.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgpack
import numpy as np

# dtype.str of the plain numeric dtypes, either byte order ("|" for one-byte types), and unicode strings
_DTYPE_STR = re.compile(r"^[<>|=]?(b1|u1|u2|u4|u8|i1|i2|i4|i8|f2|f4|f8|U[1-9][0-9]{0,7})$")
MAX_NDIM = 32
MAX_OBJECTS = 1 << 17
MAX_DEPTH = 64
_ARRAY_KEYS = frozenset({b"__ndarray__", b"data", b"dtype", b"shape"})
_SCALAR_KEYS = frozenset({b"__npgeneric__", b"data", b"dtype"})


class WireError(ValueError):
    """A frame that is not openpi msgpack-numpy we can read. `kind` is a short, bounded label."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _dtype(value: Any) -> np.dtype:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or not _DTYPE_STR.fullmatch(value):
        raise WireError("bad_dtype",
                        f"array dtype {value!r} is not accepted; send bool, int, uint, float or unicode arrays")
    return np.dtype(value)


def _array(obj: dict) -> np.ndarray:
    if set(obj) != _ARRAY_KEYS:
        raise WireError("bad_array", f"an __ndarray__ map has exactly the keys {sorted(k.decode() for k in _ARRAY_KEYS)}")
    dtype = _dtype(obj[b"dtype"])
    shape, data = obj[b"shape"], obj[b"data"]
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape
    ):
        raise WireError("bad_array", f"array shape must be a list of at most {MAX_NDIM} ints >= 0, got {shape!r}")
    if not isinstance(data, bytes):
        raise WireError("bad_array", f"array data must be bytes, got {type(data).__name__}")
    # Python ints: a product of hostile dims cannot wrap around
    need = math.prod(shape) * dtype.itemsize
    if need != len(data):
        raise WireError("bad_array", f"array data has {len(data)} bytes; shape {shape} of {dtype.str} needs {need}")
    if dtype.kind == "U":
        try:  # numpy keeps code points Python's codecs (and so msgspec, sending the prompt on) refuse
            data.decode("utf-32-be" if dtype.byteorder == ">" else "utf-32-le")
        except UnicodeDecodeError:
            raise WireError("bad_array", f"array data is not valid {dtype.str} text") from None
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError:  # numpy refuses dims whose product overflows, even with a zero among them
        raise WireError("bad_array", f"array shape {shape} is too large") from None


def _scalar(obj: dict) -> Any:
    if set(obj) != _SCALAR_KEYS:
        raise WireError("bad_array", f"an __npgeneric__ map has exactly the keys {sorted(k.decode() for k in _SCALAR_KEYS)}")
    dtype = _dtype(obj[b"dtype"])
    value = obj[b"data"]
    kinds = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int), "U": (str,)}[dtype.kind]
    if not isinstance(value, kinds) or (dtype.kind != "b" and isinstance(value, bool)):
        raise WireError("bad_array", f"a {dtype.str} scalar cannot hold {value!r}")
    try:
        # plain Python values: the observation fields are validated as ints, floats and bools
        return dtype.type(value).item()
    except OverflowError:  # an int out of the dtype's range: the sender's mistake, not the front's
        raise WireError("bad_array", f"a {dtype.str} scalar cannot hold {value!r}") from None


def _object_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return _array(obj)
    if b"__npgeneric__" in obj:
        return _scalar(obj)
    return obj


def _ext_hook(code: int, _data: bytes) -> Any:
    raise WireError("bad_msgpack", f"msgpack extension type {code} is not accepted")


# msgpack's fixed-size headers: type byte -> (bytes of the value or of its length, how that is read)
_SIZED = {0xc4: (1, "len"), 0xc5: (2, "len"), 0xc6: (4, "len"),  # bin
          0xd9: (1, "len"), 0xda: (2, "len"), 0xdb: (4, "len"),  # str
          0xc7: (1, "ext"), 0xc8: (2, "ext"), 0xc9: (4, "ext"),
          0xdc: (2, "array"), 0xdd: (4, "array"), 0xde: (2, "map"), 0xdf: (4, "map"),
          0xca: (4, "skip"), 0xcb: (8, "skip"), 0xcc: (1, "skip"), 0xcd: (2, "skip"), 0xce: (4, "skip"),
          0xcf: (8, "skip"), 0xd0: (1, "skip"), 0xd1: (2, "skip"), 0xd2: (4, "skip"), 0xd3: (8, "skip"),
          0xd4: (2, "skip"), 0xd5: (3, "skip"), 0xd6: (5, "skip"), 0xd7: (9, "skip"), 0xd8: (17, "skip")}


def _check_frame(data: bytes, max_objects: int = MAX_OBJECTS, max_depth: int = MAX_DEPTH) -> None:
    """WireError when the frame holds more than `max_objects` objects, or nests containers more than
    `max_depth` deep. Reads headers only, at most `max_objects` of them; a frame that is cut short or
    malformed is left to msgpack to report."""
    pos, count, end = 0, 0, len(data)
    left = [1]  # objects still to read at each open level, the frame itself first
    while left and pos < end:
        if not left[-1]:
            left.pop()
            continue
        left[-1] -= 1
        b = data[pos]
        pos += 1
        count += 1
        if count > max_objects:
            raise WireError("too_many_objects", f"the frame holds more than {max_objects} msgpack objects; an "
                                                "observation is a map of a few arrays and fields")
        if b <= 0x7f or b >= 0xe0 or b in (0xc0, 0xc1, 0xc2, 0xc3):
            continue
        if b <= 0x8f:
            entries = 2 * (b & 0x0f)
        elif b <= 0x9f:
            entries = b & 0x0f
        elif b <= 0xbf:
            pos += b & 0x1f
            continue
        else:
            width, what = _SIZED[b]
            if what == "skip":
                pos += width
                continue
            n = int.from_bytes(data[pos:pos + width], "big")
            pos += width
            if what in ("len", "ext"):
                pos += n + (what == "ext")
                continue
            entries = n if what == "array" else 2 * n
        if entries:
            if len(left) > max_depth:
                # the errors that quote a field's value (its repr) would hit Python's recursion limit at ~1000
                raise WireError("too_deep", f"the frame nests msgpack maps or lists more than {max_depth} deep")
            left.append(entries)


def unpackb(data: bytes) -> Any:
    """Decode one frame. Raises WireError for anything that is not plain msgpack-numpy."""
    _check_frame(data)
    try:
        return msgpack.unpackb(data, object_hook=_object_hook, ext_hook=_ext_hook, raw=False,
                               strict_map_key=True)
    except WireError:
        raise
    except RecursionError:
        raise WireError("bad_msgpack", "the frame nests too deeply") from None
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, msgpack.OutOfData,
            ValueError, TypeError, UnicodeDecodeError) as exc:
        raise WireError("bad_msgpack", f"the frame is not valid msgpack ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})") from None


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in ("V", "O", "c"):
            raise TypeError(f"cannot send a {obj.dtype} array")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default)
