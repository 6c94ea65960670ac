"""openpi's msgpack-numpy wire format, decoded without trust.

`openpi_client.msgpack_numpy` (0.1.2) packs an ndarray as the map
``{b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": arr.shape}`` and a
numpy scalar as ``{b"__npgeneric__": True, b"data": scalar.item(), b"dtype": scalar.dtype.str}``, and
refuses object, void and complex dtypes when packing. Its decoder trusts whatever dtype string it is
given; this one does not: only plain numeric dtypes (bool, signed and unsigned ints, floats) become
arrays, the byte count must match the shape exactly, and any msgpack extension type is refused. There
is no pickle anywhere on this path.

`packb` writes the same format, so `openpi_client.msgpack_numpy.unpackb` reads our replies as it
reads openpi's own server's.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgpack
import numpy as np

# dtype.str of the plain numeric dtypes, either byte order ("|" for one-byte types)
_DTYPE_STR = re.compile(r"^[<>|=]?(b1|u1|u2|u4|u8|i1|i2|i4|i8|f2|f4|f8)$")
MAX_NDIM = 32
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
        raise WireError("bad_dtype", f"array dtype {value!r} is not accepted; send bool, int, uint or float arrays")
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
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError:  # numpy refuses dims whose product overflows, even with a zero among them
        raise WireError("bad_array", f"array shape {shape} is too large") from None


def _scalar(obj: dict) -> Any:
    if set(obj) != _SCALAR_KEYS:
        raise WireError("bad_array", f"an __npgeneric__ map has exactly the keys {sorted(k.decode() for k in _SCALAR_KEYS)}")
    dtype = _dtype(obj[b"dtype"])
    value = obj[b"data"]
    kinds = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int)}[dtype.kind]
    if not isinstance(value, kinds) or (dtype.kind != "b" and isinstance(value, bool)):
        raise WireError("bad_array", f"a {dtype.str} scalar cannot hold {value!r}")
    # plain Python values: the observation fields are validated as ints, floats and bools
    return dtype.type(value).item()


def _object_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return _array(obj)
    if b"__npgeneric__" in obj:
        return _scalar(obj)
    return obj


def _ext_hook(code: int, _data: bytes) -> Any:
    raise WireError("bad_msgpack", f"msgpack extension type {code} is not accepted")


def unpackb(data: bytes) -> Any:
    """Decode one frame. Raises WireError for anything that is not plain msgpack-numpy."""
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
