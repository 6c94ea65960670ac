"""The allow-list unpickler for sglang's scheduler messages: ``safe_loads``.

sglang's own scheduler runs ``pickle.loads`` on whatever reaches its socket (CVE-2026-3059 class).
Here sglang's classes are NOT instantiated: every allowed sglang global resolves to an inert stand-in
(``SglangObject`` and friends, below) that only stores the pickled state, so no sglang code
(``__init__``, ``__post_init__``, ``__setstate__``, properties) ever runs on untrusted bytes, and
sglang is never imported. numpy arrays, torch tensors and PIL images are rebuilt by small checked
functions (``torch.load(weights_only=True)`` for tensor storages). Every other global (``os.system``,
``builtins.getattr``, ``functools.partial``, ``copyreg``, ...) raises ``RefusedPickle`` before
anything is called.

This file is the whole of what decides what a pickle may do; review it on its own. The class names
it admits are the tables of `sglang_classes`.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import struct
import types
import warnings
from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.compat.errors import RefusedPickle
from candidate_scheduler.compat.sglang_classes import (
    CONTROL,
    CONTROL_STRUCTS,
    ENUM_MEMBERS,
    IO_STRUCT,
    PIL_IMAGE_CLASSES,
    POST_TRAINING_STRUCTS,
    REQ_AUX_CLASSES,
    SAMPLE,
    SAMPLING_AUX_CLASSES,
    SAMPLING_PARAMS_CLASSES,
    SCHEDULE_BATCH,
)

MAX_PICKLE_BYTES = protocol.MAX_MESSAGE_BYTES
# One decoded observation (and every array/tensor/image rebuilt from a pickle) stays under this.
MAX_ARRAY_BYTES = protocol.MAX_OBSERVATION_BYTES
MAX_IMAGE_PIXELS = MAX_ARRAY_BYTES // 4


# ---------------------------------------------------------------------------------------------------
# Nothing find_class hands out can be changed by a pickle
# ---------------------------------------------------------------------------------------------------
# Every object of the allow-list is shared by every request of every client for the life of the process.
# pickle's BUILD opcode applies state to whatever is on its stack: through ``__setstate__`` when the object
# has one, otherwise by writing its ``__dict__`` and calling setattr for "slot state". Applied to an
# allow-listed class or function it would change it for everyone (an 85-byte pickle setting
# ``DataType.__members_by_value__ = {}`` broke every later request). So each of them refuses BUILD and
# setattr: stub classes through `_SealedType`, functions wrapped in `_SealedCallable`, the ndarray token
# by its own class. (Builtin types on the list -- set, complex, ... -- are immutable already.)


def _refuse_build(*_args: Any) -> None:
    raise RefusedPickle("refused: BUILD applied to an allow-listed global (it would change it for every client)")


class _SealedType(type):
    """Metaclass of the stand-in classes: the classes themselves cannot be changed by a pickle."""

    # A data descriptor on the metaclass wins over the class's own ``__setstate__`` when pickle looks it up
    # on the CLASS (BUILD applied to the class), while instances still find their class's method.
    @property
    def __setstate__(cls):
        return _refuse_build

    def __setattr__(cls, name: str, value: Any) -> None:
        raise RefusedPickle(f"refused: allow-listed class {cls.__qualname__} cannot be changed")

    def __delattr__(cls, name: str) -> None:
        raise RefusedPickle(f"refused: allow-listed class {cls.__qualname__} cannot be changed")


class _SealedCallable:
    """An allowed function as find_class hands it out: it can be called (REDUCE), nothing else. A bare
    function would take BUILD state into its ``__dict__`` and setattr (``__defaults__``, ``__kwdefaults__``)."""

    __slots__ = ()
    __setstate__ = _refuse_build

    def __setattr__(self, name: str, value: Any) -> None:
        _refuse_build()

    def __delattr__(self, name: str) -> None:
        _refuse_build()

    def __repr__(self) -> str:
        return f"<allowed {type(self).__qualname__}>"


def _sealed(func: Any) -> _SealedCallable:
    # one subclass a function, its __call__ the function: there is no instance state to overwrite
    return type(func.__name__, (_SealedCallable,), {"__slots__": (), "__call__": staticmethod(func),
                                                    "__module__": __name__})()


# ---------------------------------------------------------------------------------------------------
# Inert stand-ins for sglang's classes
# ---------------------------------------------------------------------------------------------------


class SglangObject(metaclass=_SealedType):
    """State of one pickled sglang object. Construction and BUILD only store data."""

    __sglang_class__ = "?"
    __sglang_kind__ = "object"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Only reached through REDUCE (calling the class). Dataclasses never pickle that way.
        if args or kwargs:
            raise RefusedPickle(f"refused: {self.__sglang_class__} cannot be called with arguments")

    def __setstate__(self, state: Any) -> None:
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        for part in (state, slots):
            if part is None:
                continue
            if not isinstance(part, dict):
                raise RefusedPickle(f"refused: state of {self.__sglang_class__} is not a dict")
            for key, value in part.items():
                if not isinstance(key, str) or key.startswith("__"):
                    raise RefusedPickle(f"refused: bad attribute name in {self.__sglang_class__} state")
                self.__dict__[key] = value

    def __repr__(self) -> str:  # never the state: it is untrusted and may be large
        return f"<sglang {self.__sglang_class__} (inert)>"


class ReqStub(SglangObject):
    """A pickled ``Req``. Like sglang's Req, attributes it lacks are read from ``sampling_params``."""

    __sglang_kind__ = "req"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        sp = self.__dict__.get("sampling_params")
        if isinstance(sp, SglangObject) and name in sp.__dict__:
            return sp.__dict__[name]
        raise AttributeError(name)


class SamplingParamsStub(SglangObject):
    __sglang_kind__ = "sampling_params"


class OutputBatchStub(SglangObject):
    __sglang_kind__ = "output_batch"


class ControlStub(SglangObject):
    """A msgspec control struct (pickled as ``cls(*field_values)``)."""

    __sglang_kind__ = "control"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["args"] = args
        self.__dict__["kwargs"] = kwargs

    @property
    def name(self) -> str:
        return self.__sglang_class__.rsplit(".", 1)[-1]


class PostTrainingStub(SglangObject):
    __sglang_kind__ = "post_training"

    @property
    def name(self) -> str:
        return self.__sglang_class__.rsplit(".", 1)[-1]


class EnumStub(metaclass=_SealedType):
    """A pickled enum member (``cls(value)``); ``name`` comes from the static member table."""

    __sglang_class__ = "?"
    __members_by_value__: dict[Any, str] = {}

    def __init__(self, value: Any) -> None:
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            raise RefusedPickle(f"refused: bad value for enum {self.__sglang_class__}")
        self.value = value
        self.name = self.__members_by_value__.get(value)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, EnumStub)
            and other.__sglang_class__ == self.__sglang_class__
            and other.value == self.value
        )

    def __hash__(self) -> int:
        return hash((self.__sglang_class__, self.value))

    # enums pickle as ``cls(value)`` alone; state after that would only give a member a false name
    __setstate__ = _refuse_build

    def __repr__(self) -> str:
        return f"<sglang {self.__sglang_class__}.{self.name or self.value!r}>"


class PILImageStub(metaclass=_SealedType):
    """A pickled PIL image (state ``[info, mode, size, palette, data]``); ``to_pil`` rebuilds it with
    ``Image.frombytes`` after checking mode, size and byte count."""

    __sglang_class__ = "PIL.Image.Image"
    _MODES = {"1": 1 / 8, "L": 1, "P": 1, "LA": 2, "PA": 2, "RGB": 3, "RGBA": 4, "RGBX": 4, "CMYK": 4,
              "YCbCr": 3, "I": 4, "F": 4, "I;16": 2}

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, list) or len(state) < 5:
            raise RefusedPickle("refused: PIL image state must be [info, mode, size, palette, data]")
        info, mode, size, palette, data = state[:5]
        if mode not in self._MODES:
            raise RefusedPickle(f"refused: PIL image mode {mode!r} is not supported")
        if (not isinstance(size, tuple) or len(size) != 2
                or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
            raise RefusedPickle("refused: PIL image size must be two positive ints")
        w, h = size
        if w * h > MAX_IMAGE_PIXELS:
            raise RefusedPickle(f"refused: PIL image of {w}x{h} pixels is over the {MAX_IMAGE_PIXELS}-pixel limit")
        expected = math.ceil(w / 8) * h if mode == "1" else int(w * h * self._MODES[mode])
        if not isinstance(data, (bytes, bytearray)) or len(data) != expected:
            raise RefusedPickle(f"refused: PIL image data does not match {mode} {w}x{h}")
        if palette is not None and (not isinstance(palette, (list, bytes)) or len(palette) > 1024):
            raise RefusedPickle("refused: bad PIL palette")
        self.info = info if isinstance(info, dict) else {}
        self.mode, self.size, self.palette, self.data = mode, size, palette, bytes(data)

    def to_pil(self):
        from PIL import Image

        img = Image.frombytes(self.mode, self.size, self.data)
        if self.mode in ("P", "PA") and self.palette:
            img.putpalette(self.palette)
        exif = self.info.get("exif")
        if isinstance(exif, (bytes, bytearray)):
            img.info["exif"] = bytes(exif)
        return img


def _stub_type(base: type, module: str, name: str, **attrs: Any) -> type:
    return type(name, (base,), {"__module__": "candidate_scheduler.compat.unpickle.inert",
                                "__qualname__": name, "__sglang_class__": f"{module}.{name}", **attrs})


# ---------------------------------------------------------------------------------------------------
# Checked rebuilders for the non-sglang globals a request legitimately holds
# ---------------------------------------------------------------------------------------------------


# --- numpy, checked -------------------------------------------------------------------------------

_NUMPY_KINDS = "biufcSU"  # no object (O), void/structured (V) or datetime (M, m) dtypes


class _NdarrayToken:
    """Stands for ``numpy.ndarray`` as the subtype argument of ``_reconstruct``; not callable, so
    ``numpy.ndarray(huge_shape)`` cannot be reached through REDUCE. One instance for every client: no
    state, and BUILD refused (see `_SealedType`)."""

    __slots__ = ()
    __setstate__ = _refuse_build

    def __setattr__(self, name: str, value: Any) -> None:
        _refuse_build()

    def __repr__(self) -> str:
        return "<numpy.ndarray (token)>"


_NDARRAY = _NdarrayToken()


def _check_dtype(dtype: Any) -> np.dtype:
    if (not isinstance(dtype, np.dtype) or dtype.kind not in _NUMPY_KINDS or dtype.fields is not None
            or dtype.subdtype is not None):
        raise RefusedPickle(f"refused: numpy dtype {dtype!r} is not allowed")
    # numpy's own pickles BUILD a dtype after making it (to set its byte order), and dtype.__setstate__
    # also takes flags: "holds Python objects" on a bytes dtype would read raw pickle bytes as pointers.
    # So what is checked and used is a dtype made afresh from the plain description.
    fresh = np.dtype(dtype.str)
    if fresh != dtype or fresh.flags != dtype.flags or fresh.hasobject:
        raise RefusedPickle(f"refused: numpy dtype {dtype.str!r} carries altered flags")
    return fresh


def _safe_dtype(obj: Any, align: bool = False, copy: bool = False) -> np.dtype:
    if not isinstance(obj, str) or len(obj) > 16:
        raise RefusedPickle("refused: numpy dtype must be named by a short string")
    # Always a copy, as numpy's own pickles ask (dtype(name, align, copy=True)): the BUILD that follows sets
    # the byte order on it; applied to numpy's shared builtin dtype it would be ignored (">f4" read as "<f4").
    # What BUILD leaves is checked where the dtype is used (`_check_dtype`).
    dtype = np.dtype(obj, copy=True)
    _check_dtype(dtype)
    return dtype


def _safe_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    # numpy pickles arrays as _reconstruct(ndarray, (0,), b'b') followed by ndarray.__setstate__, which
    # checks the buffer length against the declared shape and dtype.
    if subtype is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise RefusedPickle("refused: unexpected numpy _reconstruct arguments")
    return _CheckedNdarray((0,), dtype=np.int8)


class _CheckedNdarray(np.ndarray):
    """The array ``_reconstruct`` returns: its BUILD (``ndarray.__setstate__``) takes the dtype as the
    pickle left it, after any BUILD of the dtype itself, so the dtype is checked here, at use."""

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) != 5 or not isinstance(state[4], (bytes, bytearray)):
            raise RefusedPickle("refused: numpy array state must be (version, shape, dtype, fortran, bytes)")
        version, shape, dtype, fortran, raw = state
        super().__setstate__((version, shape, _check_dtype(dtype), fortran, raw))


def _safe_scalar(dtype: Any, data: Any = None) -> Any:
    dtype = _check_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise RefusedPickle("refused: numpy scalar data does not match its dtype")
    return np.frombuffer(data, dtype=dtype)[0]


def _safe_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    dtype = _check_dtype(dtype)
    if isinstance(buf, pickle.PickleBuffer):
        buf = buf.raw()
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise RefusedPickle("refused: numpy buffer must be bytes")
    if (not isinstance(shape, tuple) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise RefusedPickle("refused: bad numpy shape")
    if order not in ("C", "F"):
        raise RefusedPickle("refused: bad numpy order")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(buf):
        raise RefusedPickle("refused: numpy buffer length does not match shape")
    return np.frombuffer(bytes(buf), dtype=dtype).reshape(shape, order=order)


# --- torch, checked (torch is imported only when a pickle holds a tensor) -------------------------


def _safe_load_storage(data: Any) -> Any:
    """Replacement for ``torch.storage._load_from_bytes`` (which calls ``torch.load(weights_only=False)``,
    i.e. plain pickle): the storage bytes are read by torch's own weights-only unpickler."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_PICKLE_BYTES:
        raise RefusedPickle("refused: tensor storage must be bytes")
    import torch

    try:
        storage = torch.load(io.BytesIO(bytes(data)), weights_only=True, map_location="cpu")
    except Exception as exc:  # weights_only refuses anything but tensors/storages and plain containers
        raise RefusedPickle(f"refused: tensor storage rejected by torch.load(weights_only=True): "
                            f"{type(exc).__name__}") from None
    if not isinstance(storage, (torch.storage.TypedStorage, torch.storage.UntypedStorage)):
        raise RefusedPickle("refused: tensor storage bytes did not hold a storage")
    return storage


def _safe_rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                         backward_hooks: Any = None, metadata: Any = None) -> Any:
    import torch

    if not isinstance(storage, (torch.storage.TypedStorage, torch.storage.UntypedStorage)):
        raise RefusedPickle("refused: tensor rebuilt from something that is not a storage")
    ints = (storage_offset,) + tuple(size if isinstance(size, tuple) else ()) + tuple(
        stride if isinstance(stride, tuple) else ())
    if (not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride) or len(size) > 8
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)):
        raise RefusedPickle("refused: bad tensor geometry")
    if backward_hooks or metadata:
        raise RefusedPickle("refused: tensors with hooks or metadata are not accepted")
    with warnings.catch_warnings():  # TypedStorage is deprecated, but it is what tensors pickle with
        warnings.simplefilter("ignore")
        numel = storage.size() if isinstance(storage, torch.storage.TypedStorage) else storage.nbytes()
    extent = storage_offset + sum((d - 1) * s for d, s in zip(size, stride)) + 1 if all(size) else 0
    if extent > numel:
        raise RefusedPickle("refused: tensor geometry runs past its storage")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, bool(requires_grad),
                                              collections.OrderedDict())


# --- builtins, checked ------------------------------------------------------------------------------


def _safe_bytearray(*args: Any) -> bytearray:
    if len(args) > 1 or (args and not isinstance(args[0], (bytes, bytearray, list))):
        raise RefusedPickle("refused: bytearray takes only bytes")  # bytearray(10**12) would allocate
    return bytearray(*args)


def _safe_codecs_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    # Protocols 0-2 write bytes as _codecs.encode(str, "latin1").
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RefusedPickle("refused: _codecs.encode is accepted only for latin1 bytes")
    return text.encode("latin1")


def _build_allow_list() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {}
    allowed[(SCHEDULE_BATCH, "Req")] = _stub_type(ReqStub, SCHEDULE_BATCH, "Req")
    allowed[(SCHEDULE_BATCH, "OutputBatch")] = _stub_type(OutputBatchStub, SCHEDULE_BATCH, "OutputBatch")
    for table in (SAMPLING_PARAMS_CLASSES, SAMPLING_AUX_CLASSES):
        for mod, names in table.items():
            for name in names:
                module = f"{SAMPLE}.{mod}"
                allowed[(module, name)] = _stub_type(SamplingParamsStub, module, name)
    for qual, members in ENUM_MEMBERS.items():
        module, name = qual.rsplit(".", 1)
        allowed[(module, name)] = _stub_type(EnumStub, module, name, __members_by_value__=dict(members))
    for name in CONTROL_STRUCTS:
        allowed[(CONTROL, name)] = _stub_type(ControlStub, CONTROL, name)
    for name in POST_TRAINING_STRUCTS:
        allowed[(IO_STRUCT, name)] = _stub_type(PostTrainingStub, IO_STRUCT, name)
    for module, name in REQ_AUX_CLASSES:
        allowed[(module, name)] = _stub_type(SglangObject, module, name)
    for module, name in PIL_IMAGE_CLASSES:
        allowed[(module, name)] = PILImageStub
    for np_mod in ("numpy.core", "numpy._core"):
        allowed[(f"{np_mod}.multiarray", "_reconstruct")] = _safe_reconstruct
        allowed[(f"{np_mod}.multiarray", "scalar")] = _safe_scalar
        allowed[(f"{np_mod}.numeric", "_frombuffer")] = _safe_frombuffer
    allowed[("numpy", "ndarray")] = _NDARRAY
    allowed[("numpy", "dtype")] = _safe_dtype
    allowed[("torch._utils", "_rebuild_tensor_v2")] = _safe_rebuild_tensor
    allowed[("torch.storage", "_load_from_bytes")] = _safe_load_storage
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("_codecs", "encode")] = _safe_codecs_encode
    for name, value in (("set", set), ("frozenset", frozenset), ("complex", complex), ("slice", slice),
                        ("bytearray", _safe_bytearray)):
        allowed[("builtins", name)] = value
        allowed[("__builtin__", name)] = value
    sealed: dict[int, _SealedCallable] = {}  # one wrapper a function (numpy.core and numpy._core share them)
    for key, value in allowed.items():
        if isinstance(value, types.FunctionType):
            allowed[key] = sealed.setdefault(id(value), _sealed(value))
    return allowed


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = _build_allow_list()


# pickle's pure-Python unpickler, not the C one: the C unpickler keeps the memo as an array and grows it
# to 2*i slots (zeroed) on PUT / LONG_BINPUT i, so a 9-byte pickle with index 2**31 made it allocate and
# touch 32 GiB -- inside the receive loop for small payloads. This one keeps the memo in a dict, and the
# index is bounded anyway: a pickler numbers its memo 0, 1, 2, ..., never past its own length.
class _RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self._payload_bytes = len(data)

    def _memo_put(self, index: int) -> None:
        if not 0 <= index <= self._payload_bytes:
            raise RefusedPickle(f"refused: memo index {index} is past the payload's {self._payload_bytes} bytes")
        self.memo[index] = self.stack[-1]

    def _load_put(self) -> None:
        line = self.readline()
        if len(line) > 24:  # int() of a megabyte of digits is itself slow
            raise RefusedPickle("refused: memo index too long")
        self._memo_put(int(line[:-1]))

    def _load_long_binput(self) -> None:
        (index,) = struct.unpack("<I", self.read(4))
        self._memo_put(index)

    def _load_bytearray8(self) -> None:
        # the Python unpickler makes bytearray(n) -- n zeroed bytes -- before reading them; n comes
        # from the pickle, so it must be bytes the payload can actually hold
        (size,) = struct.unpack("<Q", self.read(8))
        if size > self._payload_bytes:
            raise RefusedPickle(f"refused: bytearray of {size} bytes in a payload of {self._payload_bytes}")
        buf = bytearray(size)
        self.readinto(buf)
        if len(buf) != size:  # outside a frame, a short read shrinks buf instead of failing
            raise RefusedPickle("refused: pickle data was truncated")
        self.append(buf)

    def _load_newobj(self) -> None:
        # the C unpickler refuses NEWOBJ on what is not a class; the Python one would call cls.__new__
        if not isinstance(self.stack[-2], type):
            raise RefusedPickle("refused: NEWOBJ applied to something that is not a class")
        pickle._Unpickler.load_newobj(self)  # type: ignore[attr-defined]

    def _load_newobj_ex(self) -> None:
        if not isinstance(self.stack[-3], type):
            raise RefusedPickle("refused: NEWOBJ_EX applied to something that is not a class")
        pickle._Unpickler.load_newobj_ex(self)  # type: ignore[attr-defined]

    dispatch[pickle.PUT[0]] = _load_put
    dispatch[pickle.LONG_BINPUT[0]] = _load_long_binput
    dispatch[pickle.BYTEARRAY8[0]] = _load_bytearray8
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except (KeyError, TypeError):
            raise RefusedPickle(f"refused: global {str(module)[:100]}.{str(name)[:100]} is not on the allow-list") from None

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("refused: persistent ids are not accepted")


def safe_loads(data: bytes, max_bytes: int = MAX_PICKLE_BYTES) -> Any:
    """Unpickle `data` through the allow-list. Raises RefusedPickle (nothing executed) for anything
    else, for payloads over `max_bytes`, and for malformed pickles."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RefusedPickle("refused: payload must be bytes")
    if len(data) > max_bytes:
        raise RefusedPickle(f"refused: payload of {len(data)} bytes is over the {max_bytes}-byte limit")
    try:
        return _RestrictedUnpickler(bytes(data)).load()
    except RefusedPickle:
        raise
    except RecursionError:
        raise RefusedPickle("refused: pickle nests too deeply") from None
    except MemoryError:
        raise RefusedPickle("refused: pickle needs too much memory") from None
    except Exception as exc:  # malformed or inconsistent: UnpicklingError, EOFError, TypeError, ...
        raise RefusedPickle(f"refused: unreadable pickle ({type(exc).__name__}: {str(exc)[:200]})") from None
