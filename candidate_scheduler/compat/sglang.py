"""sglang 0.5.23 compatibility: sglang's scheduler messages <-> candidate groups, without trusting pickle.

sglang's diffusion clients (``SchedulerClient``, ``AsyncSchedulerClient``, ``DiffGenerator`` in remote
mode, and the FastAPI server) talk to their scheduler with pickled ``Req`` / ``OutputBatch`` objects
over a ZMQ ROUTER. This module is everything the compat bridge (``compat_bridge.py``) needs to speak
that protocol safely; it never imports sglang at import time, and the bridge never imports sglang at
all.

Reading (``safe_loads``): an allow-list-only unpickler. sglang's own classes are NOT instantiated:
every allowed sglang global resolves to an inert stand-in (``SglangObject`` and friends) that only
stores the pickled state, so no sglang code (``__init__``, ``__post_init__``, ``__setstate__``,
properties) ever runs on untrusted bytes. numpy arrays, torch tensors and PIL images are rebuilt by
small checked functions (``torch.load(weights_only=True)`` for tensor storages). Every other global
(``os.system``, ``builtins.getattr``, ``functools.partial``, ``copyreg``, ...) raises
``RefusedPickle`` before anything is called.

Writing (``dumps_output_batch``): the reply is a real ``OutputBatch`` on the client side. Without
importing sglang, the pickle names the class directly (``GLOBAL OutputBatch; EMPTY_TUPLE; NEWOBJ;
<state dict>; BUILD``) -- exactly what pickling the dataclass produces (`dumps_foreign`).

Mapping (``classify``, ``plan_generation``, ``reply_for_result``): one sglang request -> one native
candidate group (``protocol.SubmitRequest``); one ``GroupResult`` -> one ``OutputBatch`` shaped like
sglang's Cosmos3 action output. See docs/sglang-compat.md for the table.

sglang side (lazy imports): ``install_http_shims`` and ``run_http_server`` start sglang's own FastAPI
server pointed at the bridge.
"""

from __future__ import annotations

import base64
import binascii
import collections
import io
import math
import os
import pickle
import re
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec

SGLANG_VERSION = "0.5.23"

MAX_PICKLE_BYTES = protocol.MAX_MESSAGE_BYTES
# One decoded observation (and every array/tensor/image rebuilt from a pickle) stays under this.
MAX_ARRAY_BYTES = protocol.MAX_OBSERVATION_BYTES
MAX_IMAGE_PIXELS = MAX_ARRAY_BYTES // 4
MAX_IMAGE_FILE_BYTES = MAX_ARRAY_BYTES
MAX_OBSERVATIONS = 64

# Where a candidate spec may travel inside a Req (first match wins; two different ones are an error).
CANDIDATE_SPEC_KEY = "candidates"

_SB = "sglang.multimodal_gen.runtime.pipelines_core.schedule_batch"
_SAMPLE = "sglang.multimodal_gen.configs.sample"
_TASK_TYPE = "sglang.multimodal_gen.configs.task_type"
_CONTROL = "sglang.multimodal_gen.runtime.entrypoints.control_requests"
_IO_STRUCT = "sglang.multimodal_gen.runtime.entrypoints.post_training.io_struct"


class RefusedPickle(pickle.UnpicklingError):
    """A payload the allow-list does not accept. Nothing in it was executed."""


class CompatError(ValueError):
    """A request that was read safely but cannot be served; the text goes to OutputBatch.error."""


# ---------------------------------------------------------------------------------------------------
# Inert stand-ins for sglang's classes
# ---------------------------------------------------------------------------------------------------


class SglangObject:
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


class EnumStub:
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

    def __repr__(self) -> str:
        return f"<sglang {self.__sglang_class__}.{self.name or self.value!r}>"


class PILImageStub:
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


# ---------------------------------------------------------------------------------------------------
# The allow-list: every global a pickle may name, and what it resolves to
# ---------------------------------------------------------------------------------------------------

# Every SamplingParams / ActionSamplingParams class defined under sglang.multimodal_gen.configs.sample in
# sglang 0.5.23 (tests/compat checks this list against the installed sglang), plus the parameter
# dataclasses those classes hold.
SAMPLING_PARAMS_CLASSES: dict[str, tuple[str, ...]] = {
    "action": ("ActionSamplingParams",),
    "anima": ("AnimaSamplingParams",),
    "cosmos3": ("Cosmos3SamplingParams",),
    "cosmos3_multiview": ("Cosmos3MultiviewSamplingParams",),
    "cosmos3_sim_auto": ("Cosmos3SimAutoSamplingParams",),
    "cosmos_dreams": ("CosmosDreamsSamplingParams",),
    "cosmos_dreams_transfer": ("CosmosDreamsTransferSamplingParams",),
    "diffusers_generic": ("DiffusersGenericSamplingParams",),
    "ernie_image": ("ErnieImageSamplingParams",),
    "flux3_action": ("Flux3ActionSamplingParams",),
    "flux": ("Flux2KleinBaseSamplingParams", "Flux2KleinSamplingParams", "Flux2SamplingParams", "FluxSamplingParams"),
    "glmimage": ("GlmImageSamplingParams",),
    "helios": ("HeliosDistilledSamplingParams", "HeliosMidSamplingParams", "HeliosT2VSamplingParams"),
    "hunyuan3d": ("Hunyuan3DSamplingParams",),
    "hunyuan": ("FastHunyuanSamplingParam", "HunyuanSamplingParams"),
    "hunyuan_image3": ("HunyuanImage3SamplingParams",),
    "ideogram": ("Ideogram4FastSamplingParams", "Ideogram4InstantSamplingParams", "Ideogram4SamplingParams"),
    "joy_echo": ("JoyEchoSamplingParams",),
    "joy_image": ("JoyImageEditSamplingParams",),
    "kandinsky6": ("Kandinsky6TI2VADistilledSamplingParams", "Kandinsky6TI2VASamplingParams"),
    "kandinsky6_sr": ("Kandinsky6SRSamplingParams",),
    "krea2": ("Krea2SamplingParams",),
    "lingbot_video_moe": ("LingBotVideoMoESamplingParams",),
    "lingbot_world": ("LingBotWorldSamplingParams",),
    "llada_image": ("LLaDAImageSamplingParams", "LLaDAImageTurboSamplingParams"),
    "longcat_image": ("LongCatImageEditSamplingParams", "LongCatImageEditTurboSamplingParams",
                      "LongCatImageSamplingParams"),
    "longlive2": ("LongLive2SamplingParams",),
    "ltx_2": ("LTX23HQSamplingParams", "LTX23SamplingParams", "LTX2SamplingParams"),
    "ltx_2_5": ("LTX25SamplingParams",),
    "ming_image": ("MingImageLayerSamplingParams", "MingImageSamplingParams"),
    "minimax_h3": ("FastH3OmniSamplingParams", "FastH3SamplingParams", "MiniMaxH3SamplingParams"),
    "minimax_h3_vdn": ("VDNH3SamplingParams",),
    "moss_image": ("MOSSImageSamplingParams",),
    "mova": ("MOVASamplingParams", "MOVA_360P_SamplingParams", "MOVA_720P_SamplingParams"),
    "nomas": ("NomasSamplingParams",),
    "pi05": ("Pi05SamplingParams",),
    "qwenimage21": ("QwenImage21SamplingParams",),
    "qwenimage": ("QwenImage2512SamplingParams", "QwenImageEditPlusSamplingParams", "QwenImageLayeredSamplingParams",
                  "QwenImageSamplingParams"),
    "sampling_params": ("SamplingParams",),
    "sana": ("SanaSamplingParams",),
    "sana_video2": ("SanaVideo2SamplingParams",),
    "sana_video": ("SanaVideoSamplingParams",),
    "sana_wm": ("SanaWMSamplingParams",),
    "sensenova_u1": ("SenseNovaU1SamplingParams",),
    "stablediffusion3": ("StableDiffusion3SamplingParams",),
    "wan": ("FastWanT2V480PConfig", "SelfForcingWanT2V480PConfig", "Turbo_Wan2_2_I2V_A14B_SamplingParam",
            "Wan2_1_Fun_1_3B_InP_SamplingParams", "Wan2_2_Base_SamplingParams", "Wan2_2_I2V_A14B_SamplingParam",
            "Wan2_2_T2V_A14B_SamplingParam", "Wan2_2_TI2V_5B_SamplingParam", "WanI2V_14B_480P_SamplingParam",
            "WanI2V_14B_720P_SamplingParam", "WanT2V_14B_SamplingParams", "WanT2V_1_3B_SamplingParams",
            "Wan_Animate_2_14B_Distilled_SamplingParam", "Wan_Animate_2_14B_SamplingParam"),
    "zimage": ("ZImageSamplingParams", "ZImageTurboSamplingParams"),
}
SAMPLING_AUX_CLASSES: dict[str, tuple[str, ...]] = {
    "sampling_params": ("CacheParams", "SkipSoftmaxParams"),
    "spectrum": ("SpectrumParams",),
    "teacache": ("TeaCacheParams",),
}
COSMOS3_SAMPLING_PARAMS = f"{_SAMPLE}.cosmos3.Cosmos3SamplingParams"

# Enum members by value (enum.auto() numbering of sglang 0.5.23; checked by tests/compat).
ENUM_MEMBERS: dict[str, dict[int, str]] = {
    f"{_TASK_TYPE}.DataType": {1: "IMAGE", 2: "VIDEO", 3: "MESH", 4: "ACTION"},
    f"{_TASK_TYPE}.ModelTaskType": {1: "I2V", 2: "T2V", 3: "TI2V", 4: "T2I", 5: "I2I", 6: "TI2I", 7: "I2M",
                                    8: "VLA_ACTION", 9: "V2V", 10: "F2V"},
}
CONTROL_STRUCTS = ("SetLoraReq", "MergeLoraWeightsReq", "UnmergeLoraWeightsReq", "ListLorasReq", "ShutdownReq",
                   "ReleaseRealtimeSessionReq", "GetDisaggStatsReq")
POST_TRAINING_STRUCTS = ("UpdateWeightFromDiskReqInput", "UpdateWeightFromTensorReqInput",
                         "UpdateWeightFromTensorCheckerReqInput", "GetWeightsChecksumReqInput",
                         "ReleaseMemoryOccupationReqInput", "ResumeMemoryOccupationReqInput")
# What a Req carries besides its sampling params (state-only containers).
REQ_AUX_CLASSES = (
    ("sglang.multimodal_gen.runtime.utils.perf_logger", "RequestMetrics"),
    ("sglang.srt.observability.trace", "TraceNullContext"),
)
PIL_IMAGE_CLASSES = (
    ("PIL.Image", "Image"),
    ("PIL.PngImagePlugin", "PngImageFile"),
    ("PIL.JpegImagePlugin", "JpegImageFile"),
    ("PIL.WebPImagePlugin", "WebPImageFile"),
    ("PIL.BmpImagePlugin", "BmpImageFile"),
    ("PIL.GifImagePlugin", "GifImageFile"),
    ("PIL.TiffImagePlugin", "TiffImageFile"),
    ("PIL.MpoImagePlugin", "MpoImageFile"),
)


def _stub_type(base: type, module: str, name: str, **attrs: Any) -> type:
    return type(name, (base,), {"__module__": "candidate_scheduler.compat.sglang.inert",
                                "__qualname__": name, "__sglang_class__": f"{module}.{name}", **attrs})


# --- numpy, checked -------------------------------------------------------------------------------

_NUMPY_KINDS = "biufcSU"  # no object (O), void/structured (V) or datetime (M, m) dtypes


class _NdarrayToken:
    """Stands for ``numpy.ndarray`` as the subtype argument of ``_reconstruct``; not callable, so
    ``numpy.ndarray(huge_shape)`` cannot be reached through REDUCE."""

    def __repr__(self) -> str:
        return "<numpy.ndarray (token)>"


_NDARRAY = _NdarrayToken()


def _check_dtype(dtype: Any) -> np.dtype:
    if not isinstance(dtype, np.dtype) or dtype.kind not in _NUMPY_KINDS or dtype.fields is not None:
        raise RefusedPickle(f"refused: numpy dtype {dtype!r} is not allowed")
    return dtype


def _safe_dtype(obj: Any, align: bool = False, copy: bool = False) -> np.dtype:
    if not isinstance(obj, str) or len(obj) > 16:
        raise RefusedPickle("refused: numpy dtype must be named by a short string")
    dtype = np.dtype(obj)
    return _check_dtype(dtype)


def _safe_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    # numpy pickles arrays as _reconstruct(ndarray, (0,), b'b') followed by ndarray.__setstate__, which
    # checks the buffer length against the declared shape and dtype.
    if subtype is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise RefusedPickle("refused: unexpected numpy _reconstruct arguments")
    return np.ndarray((0,), dtype=np.int8)


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
    allowed[(_SB, "Req")] = _stub_type(ReqStub, _SB, "Req")
    allowed[(_SB, "OutputBatch")] = _stub_type(OutputBatchStub, _SB, "OutputBatch")
    for table in (SAMPLING_PARAMS_CLASSES, SAMPLING_AUX_CLASSES):
        for mod, names in table.items():
            for name in names:
                module = f"{_SAMPLE}.{mod}"
                allowed[(module, name)] = _stub_type(SamplingParamsStub, module, name)
    for qual, members in ENUM_MEMBERS.items():
        module, name = qual.rsplit(".", 1)
        allowed[(module, name)] = _stub_type(EnumStub, module, name, __members_by_value__=dict(members))
    for name in CONTROL_STRUCTS:
        allowed[(_CONTROL, name)] = _stub_type(ControlStub, _CONTROL, name)
    for name in POST_TRAINING_STRUCTS:
        allowed[(_IO_STRUCT, name)] = _stub_type(PostTrainingStub, _IO_STRUCT, name)
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
    return allowed


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = _build_allow_list()


class _RestrictedUnpickler(pickle.Unpickler):
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
        return _RestrictedUnpickler(io.BytesIO(bytes(data))).load()
    except RefusedPickle:
        raise
    except RecursionError:
        raise RefusedPickle("refused: pickle nests too deeply") from None
    except MemoryError:
        raise RefusedPickle("refused: pickle needs too much memory") from None
    except Exception as exc:  # malformed or inconsistent: UnpicklingError, EOFError, TypeError, ...
        raise RefusedPickle(f"refused: unreadable pickle ({type(exc).__name__}: {str(exc)[:200]})") from None


# ---------------------------------------------------------------------------------------------------
# Replies: a real sglang OutputBatch, pickled without importing sglang
# ---------------------------------------------------------------------------------------------------

# OutputBatch's fields and defaults in sglang 0.5.23 (tests/compat checks them against the dataclass).
OUTPUT_BATCH_DEFAULTS: dict[str, Any] = {
    "output": None, "raw_frame_batches": None, "raw_frame_content_type": "application/x-raw-rgb",
    "raw_frame_metadata": None, "audio": None, "audio_sample_rate": None, "fps": None, "action_pred": None,
    "action_mode": None, "action_domain_id": None, "action_raw_action_dim": None, "trajectory_timesteps": None,
    "trajectory_latents": None, "rollout_trajectory_data": None, "trajectory_decoded": None, "error": None,
    "output_file_paths": None, "output_image_bytes": None, "lidar": None, "metrics": None, "metrics_list": None,
    "noise_pred": None, "peak_memory_mb": 0.0, "usage": None,
}
_GLOBAL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(eq=False)
class ForeignObject:
    """An instance of a class this process does not import, for `dumps_foreign`.

    Pickled as ``module.name`` created blank (``cls.__new__(cls)``) and filled by BUILD with `state` --
    what pickling a plain dataclass writes -- or, with ``call=True``, as ``cls(*args)`` (enums, msgspec
    structs)."""

    module: str
    name: str
    state: Any = None
    args: tuple = ()
    call: bool = False


class _ForeignPickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table can be extended
    dispatch = pickle._Pickler.dispatch.copy()

    def _save_foreign(self, obj: ForeignObject) -> None:
        if not (_GLOBAL_NAME.match(obj.module) and _GLOBAL_NAME.match(obj.name)):
            raise pickle.PicklingError(f"bad global {obj.module}.{obj.name}")
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("ascii"))
        if obj.call:
            self.save(tuple(obj.args))
            self.write(pickle.REDUCE)
        else:
            self.write(pickle.EMPTY_TUPLE + pickle.NEWOBJ)
        self.memoize(obj)
        if obj.state is not None:
            self.save(obj.state)
            self.write(pickle.BUILD)

    dispatch[ForeignObject] = _save_foreign


def dumps_foreign(obj: Any, protocol: int = 4) -> bytes:
    """pickle.dumps, where every `ForeignObject` inside `obj` is written as its class would pickle it."""
    buf = io.BytesIO()
    _ForeignPickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


def dumps_output_batch(**fields: Any) -> bytes:
    unknown = set(fields) - set(OUTPUT_BATCH_DEFAULTS)
    if unknown:
        raise TypeError(f"OutputBatch has no field(s) {sorted(unknown)}")
    return dumps_foreign(ForeignObject(_SB, "OutputBatch", {**OUTPUT_BATCH_DEFAULTS, **fields}))


def error_reply(message: str) -> bytes:
    return dumps_output_batch(error=str(message)[:4000])


# ---------------------------------------------------------------------------------------------------
# What a message is
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Warmup:
    """A server- or request-based warmup Req; answered at once with an empty successful OutputBatch."""

    count: int


@dataclass(frozen=True)
class Answer:
    """A message answered without the scheduler (unsupported control struct, unknown type, bad group)."""

    error: str


@dataclass(frozen=True)
class Generation:
    reqs: tuple  # of ReqStub; length > 1 only for an expand_request_outputs group


def _type_repr(obj: Any) -> str:
    """How sglang prints ``type(obj)`` in its "Unknown request type" error."""
    name = getattr(type(obj), "__sglang_class__", None)
    return f"<class '{name}'>" if isinstance(name, str) and name != "?" else repr(type(obj))


def classify(obj: Any) -> Ping | Shutdown | Warmup | Answer | Generation:
    """Sort one unpickled payload the way sglang's Scheduler does (`_normalize_received_payload`,
    `_dispatch_single_request`): Req, [Req], list[Req] (one grouped request), control structs."""
    if isinstance(obj, dict) and obj.get("method") == "ping" and len(obj) == 1:
        return Ping()
    if isinstance(obj, list):
        if not obj:
            return Answer("Invalid scheduler request: ValueError: request list cannot be empty")
        if not all(isinstance(r, ReqStub) for r in obj):
            return Answer(f"Unknown request group type: {type(obj)}")
        if len(obj) == 1:
            obj = obj[0]
        else:
            if any(_is_warmup(r) for r in obj):
                return Warmup(len(obj))
            return Generation(tuple(obj))
    if isinstance(obj, ReqStub):
        if _is_warmup(obj):
            return Warmup(1)
        return Generation((obj,))
    if isinstance(obj, ControlStub) and obj.name == "ShutdownReq":
        return Shutdown()
    if isinstance(obj, (ControlStub, PostTrainingStub)):
        return Answer(f"{obj.name} is not supported by candidate_scheduler (sglang compat bridge)")
    return Answer(f"Unknown request type: {_type_repr(obj)}")


def _is_warmup(req: ReqStub) -> bool:
    extra = req.__dict__.get("extra")
    prewarm = isinstance(extra, dict) and bool(extra.get("server_internal_prewarm"))
    return req.__dict__.get("is_warmup") is True or prewarm


# ---------------------------------------------------------------------------------------------------
# Req -> one candidate group
# ---------------------------------------------------------------------------------------------------

# Fields of a Cosmos3 policy request that the native protocol cannot carry. A value other than the one
# sglang's own action endpoint sends is refused instead of being silently ignored (it would change the
# result). (field, allowed values)
UNSUPPORTED_FIELDS: tuple[tuple[str, tuple], ...] = (
    ("video_path", (None,)),
    ("flow_shift", (None,)),
    ("action_fps", (None,)),
    ("max_sequence_length", (None,)),
    ("condition_frame_indexes", (None,)),
    ("action_view_point", ("ego_view",)),
    ("action_normalization", ("quantile",)),
    ("control_path", (None,)),
    ("action", (None,)),
    ("rollout", (False,)),
    ("return_trajectory_latents", (False,)),
    ("return_trajectory_decoded", (False,)),
    ("rollout_return_dit_trajectory", (False,)),
    ("rollout_return_denoising_env", (False,)),
    ("latents", (None,)),
    ("action_latents", (None,)),
    ("sigmas", (None,)),
    ("timesteps", (None,)),
    ("generator", (None,)),
    ("realtime_session_id", (None,)),
)


@dataclass(frozen=True)
class GroupPlan:
    """One sglang request mapped to one native group, and how to shape the answer.

    kind: "single" (a plain Req, count=1), "candidates" (a Req with a candidate spec) or "outputs"
    (a list[Req] from expand_request_outputs: one output per candidate)."""

    kind: str
    submit: protocol.SubmitRequest
    request_ids: tuple  # sglang request_id of each output entry (None allowed)
    spec: CandidateTrajectorySpec
    batched: bool
    action_mode: str
    domain_id: int
    raw_action_dim: int
    num_inference_steps: int
    num_frames: int


_MISSING = object()


def _attr(req: Any, name: str, default: Any = None) -> Any:
    try:
        return getattr(req, name)
    except AttributeError:
        return default


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # e.g. arrays: ambiguous truth value
        return False


def _int(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, (np.integer,)):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CompatError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise CompatError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, (np.floating, np.integer)):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CompatError(f"{name} must be a finite number")
    return float(value)


def _enum_name(value: Any) -> str | None:
    return value.name if isinstance(value, EnumStub) else None


def find_candidate_spec(req: ReqStub) -> Any:
    """The raw candidate spec a Req carries, or None. Looked up, in order, at
    ``req.extra["candidates"]``, ``req.extra["diffusers_kwargs"]["candidates"]`` and
    ``req.sampling_params.diffusers_kwargs["candidates"]``; two different values are an error."""
    found = []
    extra = req.__dict__.get("extra")
    if isinstance(extra, dict):
        if CANDIDATE_SPEC_KEY in extra:
            found.append(extra[CANDIDATE_SPEC_KEY])
        dk = extra.get("diffusers_kwargs")
        if isinstance(dk, dict) and CANDIDATE_SPEC_KEY in dk:
            found.append(dk[CANDIDATE_SPEC_KEY])
    sp = req.__dict__.get("sampling_params")
    if isinstance(sp, SglangObject):
        dk = sp.__dict__.get("diffusers_kwargs")
        if isinstance(dk, dict) and CANDIDATE_SPEC_KEY in dk:
            found.append(dk[CANDIDATE_SPEC_KEY])
    if not found:
        return None
    first = found[0]
    if not all(_same(f, first) for f in found[1:]):
        raise CompatError("the Req carries two different candidate specs")
    return first


def parse_candidate_spec(raw: Any) -> CandidateTrajectorySpec:
    """A candidate spec from its wire form: an int (count) or a map with CandidateTrajectorySpec's keys
    (count, reducer, return_candidates, seed_policy, seeds)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"count": raw}
    if not isinstance(raw, dict):
        raise CompatError(f"candidate spec must be an int or a map, got {type(raw).__name__}")
    try:
        spec = CandidateTrajectorySpec.from_dict(raw)
    except CandidateContractError as exc:
        raise CompatError(f"bad candidate spec: {exc}") from None
    if spec.count > protocol.MAX_CANDIDATES:
        raise CompatError(f"bad candidate spec: count must be at most {protocol.MAX_CANDIDATES}")
    return spec


def _check_cosmos3_policy(req: ReqStub) -> None:
    sp = req.__dict__.get("sampling_params")
    if not isinstance(sp, SamplingParamsStub):
        raise CompatError("the Req has no sampling_params")
    if sp.__sglang_class__ != COSMOS3_SAMPLING_PARAMS:
        raise CompatError(f"candidate_scheduler serves Cosmos3 action requests only; got {sp.__sglang_class__}")
    mode = _attr(req, "action_mode")
    if _enum_name(_attr(req, "data_type")) != "ACTION" or mode is None:
        raise CompatError("candidate_scheduler serves Cosmos3 action requests only (action_mode='policy'); "
                          "this request generates video or images")
    if not isinstance(mode, str) or mode != "policy":
        raise CompatError(f"action_mode={str(mode)[:50]!r} is not supported by candidate_scheduler; only 'policy'")
    for name, allowed in UNSUPPORTED_FIELDS:
        value = _attr(req, name, _MISSING)
        if value is _MISSING:  # a field this client's sglang does not have cannot change the result
            continue
        if not any(value is a or (a is not None and type(value) is type(a) and value == a) for a in allowed):
            raise CompatError(f"{name} is not supported by candidate_scheduler (sglang compat bridge); "
                              f"leave it at {allowed[0]!r}")


def _observation_list(image_path: Any) -> list:
    if isinstance(image_path, (list, tuple)):
        items = list(image_path)
    elif isinstance(image_path, np.ndarray) and image_path.ndim == 4:
        items = list(image_path)
    else:
        items = [image_path]
    if not items or any(i is None for i in items):
        raise CompatError("Cosmos3 policy input requires an observation image (image_path)")
    if len(items) > MAX_OBSERVATIONS:
        raise CompatError(f"at most {MAX_OBSERVATIONS} observations per request")
    return items


def image_to_rgb_array(image: Any) -> np.ndarray:
    """One observation as uint8 [H, W, 3] RGB, decoded like sglang's ``load_image`` (EXIF transpose,
    then ``convert("RGB")``). Accepts a local path, a data: URL, encoded image bytes, a PIL image
    (rebuilt from its pickle) or a uint8 array [H, W], [H, W, 3] or [H, W, 4]."""
    from PIL import Image, ImageOps

    if isinstance(image, PILImageStub):
        pil = image.to_pil()
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise CompatError(f"observation arrays must be uint8, got {image.dtype}")
        if image.ndim == 3 and image.shape[-1] == 3:
            return np.ascontiguousarray(image)
        if image.ndim == 2 or (image.ndim == 3 and image.shape[-1] in (1, 4)):
            pil = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image)
        else:
            raise CompatError(f"observation array must be [H, W], [H, W, 3] or [H, W, 4], got {list(image.shape)}")
    elif isinstance(image, (str, bytes, bytearray)):
        pil = _open_image(image)
    else:
        raise CompatError(f"observation image of type {type(image).__name__} is not supported; send a path, "
                          "a data: URL, image bytes, a PIL image or a uint8 array")
    if pil.width * pil.height > MAX_IMAGE_PIXELS:
        raise CompatError(f"observation of {pil.width}x{pil.height} pixels is over the limit")
    pil = ImageOps.exif_transpose(pil)
    return np.asarray(pil.convert("RGB"), dtype=np.uint8)


def _open_image(source: str | bytes | bytearray):
    from PIL import Image

    if isinstance(source, str):
        if source.startswith("data:"):
            try:
                raw = base64.b64decode(source.split(",", 1)[1], validate=False)
            except (IndexError, binascii.Error):
                raise CompatError("bad data: URL for the observation image") from None
        elif source.startswith(("http://", "https://")):
            raise CompatError("the compat bridge does not fetch image URLs; send the image itself")
        else:
            try:
                size = os.path.getsize(source)
            except OSError:
                raise CompatError(f"observation image path {source[:200]!r} is not a readable file") from None
            if size > MAX_IMAGE_FILE_BYTES:
                raise CompatError("observation image file is too large")
            with open(source, "rb") as f:
                raw = f.read(MAX_IMAGE_FILE_BYTES + 1)
    else:
        raw = bytes(source)
    if len(raw) > MAX_IMAGE_FILE_BYTES:
        raise CompatError("observation image is too large")
    try:
        pil = Image.open(io.BytesIO(raw))
        if pil.width * pil.height > MAX_IMAGE_PIXELS:
            raise CompatError(f"observation of {pil.width}x{pil.height} pixels is over the limit")
        pil.load()
    except CompatError:
        raise
    except Exception as exc:
        raise CompatError(f"cannot decode the observation image: {type(exc).__name__}") from None
    return pil


def _observations(req: ReqStub) -> tuple[np.ndarray, bool]:
    """uint8 [H, W, 3] for one observation, or [B, H, W, 3] and batched=True for B > 1 (sglang's
    Cosmos3 builder sends one image as itself and B > 1 images as a list)."""
    arrays = [image_to_rgb_array(i) for i in _observation_list(_attr(req, "image_path"))]
    if len(arrays) == 1:
        return arrays[0], False
    if any(a.shape != arrays[0].shape for a in arrays):
        raise CompatError("batched observation images must all have the same size")
    return np.stack(arrays), True


def _prompt(req: ReqStub, batch: int) -> str | list[str]:
    prompt = _attr(req, "prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) not in (1, batch):
            raise CompatError(f"{len(prompt)} prompts for {batch} observations")
        return prompt if batch > 1 else prompt[0]
    raise CompatError("prompt must be a string (or a list of strings for batched observations)")


def _seed(value: Any, name: str = "seed") -> int:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    seed = _int(value, name)
    if not 0 <= seed < 2**64:
        raise CompatError(f"{name} must be in [0, 2**64), got {seed}")
    return seed


def _sampling(req: ReqStub) -> tuple[protocol.SamplingMsg, int, int]:
    height = _int(_attr(req, "height"), "height", 1)
    width = _int(_attr(req, "width"), "width", 1)
    steps = _int(_attr(req, "num_inference_steps"), "num_inference_steps", 1)
    num_frames = _int(_attr(req, "num_frames"), "num_frames", 2)
    domain_id = _attr(req, "domain_id")
    raw_action_dim = _attr(req, "raw_action_dim")
    if domain_id is None or raw_action_dim is None:
        raise CompatError("candidate_scheduler needs domain_id and raw_action_dim "
                          "(domain_name alone is not resolved by the compat bridge)")
    negative = _attr(req, "negative_prompt")
    sampling = protocol.SamplingMsg(
        height=height, width=width, steps=steps, horizon=num_frames - 1,
        guidance_scale=_float(_attr(req, "guidance_scale", 1.0), "guidance_scale"),
        action_mode="policy", domain_id=_int(domain_id, "domain_id", 0),
        raw_action_dim=_int(raw_action_dim, "raw_action_dim", 1),
        fps=_int(_attr(req, "fps", 5), "fps", 1),
        negative_prompt=negative if isinstance(negative, str) else None,
    )
    return sampling, steps, num_frames


def _request_id(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _native_id(base: str | None) -> str:
    tag = uuid.uuid4().hex[:12]
    return f"sglang:{base[:200]}#{tag}" if base else f"sglang:{tag}"


_COMPARED_FIELDS = ("prompt", "height", "width", "num_inference_steps", "num_frames", "guidance_scale",
                    "domain_id", "raw_action_dim", "fps", "negative_prompt", "action_mode")


def plan_generation(reqs: tuple) -> GroupPlan:
    """Map one Req, or one expand_request_outputs group, to one native SubmitRequest."""
    head = reqs[0]
    for r in reqs:
        _check_cosmos3_policy(r)
    sampling, steps, num_frames = _sampling(head)
    images, batched = _observations(head)
    prompt = _prompt(head, images.shape[0] if batched else 1)
    rid = _request_id(_attr(head, "request_id"))
    raw_spec = find_candidate_spec(head)

    if len(reqs) == 1:
        seed = _seed(_attr(head, "seed", 42))
        if raw_spec is None:
            kind = "single"
            spec = CandidateTrajectorySpec(count=1, reducer="mean", return_candidates=True)
        else:
            kind = "candidates"
            spec = parse_candidate_spec(raw_spec)
        request_ids = (rid,)
        native_base = rid
    else:
        if any(find_candidate_spec(r) is not None for r in reqs):
            raise CompatError("a candidate spec cannot be combined with num_outputs_per_prompt > 1: "
                              "ask for one or the other")
        for r in reqs[1:]:
            for name in _COMPARED_FIELDS:
                if not _same(_attr(r, name), _attr(head, name)):
                    raise CompatError(f"a grouped request (list[Req]) must differ only in seed; {name} differs")
            if _attr(r, "image_path") is not _attr(head, "image_path"):
                other, _ = _observations(r)
                if other.shape != images.shape or not np.array_equal(other, images):
                    raise CompatError("a grouped request (list[Req]) must share one observation")
        seeds = [_seed(_attr(r, "seed", 42)) for r in reqs]
        seed = seeds[0]
        if all(s == seed + i for i, s in enumerate(seeds)):
            spec = CandidateTrajectorySpec(count=len(reqs), reducer="none", return_candidates=True,
                                           seed_policy="offset")
        else:
            spec = CandidateTrajectorySpec(count=len(reqs), reducer="none", return_candidates=True,
                                           seeds=tuple(seeds))
        if spec.count > protocol.MAX_CANDIDATES:
            raise CompatError(f"at most {protocol.MAX_CANDIDATES} outputs per request")
        kind = "outputs"
        request_ids = tuple(_request_id(_attr(r, "request_id")) for r in reqs)
        extra = head.__dict__.get("extra")
        parent = extra.get("parent_request_id") if isinstance(extra, dict) else None
        native_base = parent if isinstance(parent, str) else rid

    submit = protocol.SubmitRequest(
        request_id=_native_id(native_base),
        images=protocol.array_to_wire(images),
        prompt=prompt,
        candidates=protocol.CandidateSpecMsg(
            count=spec.count, reducer=spec.reducer, return_candidates=spec.return_candidates,
            seed_policy=spec.seed_policy.value, seeds=None if spec.seeds is None else list(spec.seeds),
        ),
        seed=seed,
        sampling=sampling,
        batched=batched,
    )
    return GroupPlan(kind=kind, submit=submit, request_ids=request_ids, spec=spec, batched=batched,
                     action_mode="policy", domain_id=sampling.domain_id, raw_action_dim=sampling.raw_action_dim,
                     num_inference_steps=steps, num_frames=num_frames)


# ---------------------------------------------------------------------------------------------------
# GroupResult -> OutputBatch
# ---------------------------------------------------------------------------------------------------


def _as_float32(a: protocol.Array | None, name: str) -> np.ndarray | None:
    if a is None:
        return None
    arr = protocol.array_from_wire(a)
    if not np.issubdtype(arr.dtype, np.floating):
        raise CompatError(f"scheduler returned {name} of dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _tensor(arr: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).copy())


def result_error(result: protocol.GroupResult) -> str:
    code = f" [{result.error_code}]" if result.error_code else ""
    return f"candidate_scheduler: group {result.status}{code}: {result.error or 'no detail'}"


def output_fields_for_result(plan: GroupPlan, result: protocol.GroupResult) -> dict[str, Any]:
    """The OutputBatch fields (a dict for dumps_output_batch) for one group's GroupResult."""
    if result.status != "done":
        return {"error": result_error(result)}
    candidates = _as_float32(result.candidates, "candidates")
    action = _as_float32(result.action, "action")
    raw = plan.raw_action_dim

    def trim(arr):  # actions are [.., H, raw_action_dim] in sglang's output
        return None if arr is None else arr[..., :raw] if arr.shape[-1] > raw else arr

    candidates, action = trim(candidates), trim(action)
    common = {
        "action_mode": plan.action_mode,
        "domain_id": plan.domain_id,
        "raw_action_dim": plan.raw_action_dim,
        "parameters": {"num_inference_steps": plan.num_inference_steps, "num_frames": plan.num_frames},
    }
    batch_meta = {"action_mode": plan.action_mode, "action_domain_id": plan.domain_id,
                  "action_raw_action_dim": plan.raw_action_dim}

    if plan.kind == "single":
        acts = candidates[0] if candidates is not None else action
        if acts is None:
            raise CompatError("the scheduler returned no action")
        pred = acts if plan.batched else acts[None]
        entry = {"request_id": plan.request_ids[0], "actions": acts, **common}
        return {"output": [entry], "action_pred": _tensor(pred), **batch_meta}

    if plan.kind == "outputs":
        if candidates is None or candidates.shape[0] != len(plan.request_ids):
            raise CompatError("the scheduler did not return one candidate per output")
        entries = [{"request_id": rid, "actions": candidates[i], **common} for i, rid in enumerate(plan.request_ids)]
        return {"output": entries, "action_pred": _tensor(candidates), **batch_meta}

    # kind == "candidates": one output entry for the request
    spec = plan.spec
    group = {
        "count": spec.count,
        "reducer": spec.reducer,
        "seed_policy": spec.seed_policy.value,
        "candidate_seeds": list(result.candidate_seeds),
        "chosen_candidate": result.chosen_candidate,
        "return_candidates": bool(spec.return_candidates or spec.reducer == "none"),
        "num_inputs": None,
    }
    entry: dict[str, Any] = {"request_id": plan.request_ids[0], **common, "candidate_group": group}
    if group["return_candidates"]:
        if candidates is None:
            raise CompatError("the scheduler returned no candidates")
        # [N, H, D], or [N, B, H, D] flattened candidate-major to [N*B, H, D] for batched observations
        if plan.batched:
            group["num_inputs"] = int(candidates.shape[1])
            flat = candidates.reshape((-1,) + candidates.shape[2:])
        else:
            group["num_inputs"] = 1
            flat = candidates
        entry["actions"] = flat
        entry["reduced_actions"] = action
        pred = flat
    else:
        if action is None:
            raise CompatError("the scheduler returned no reduced action")
        group["num_inputs"] = int(action.shape[0]) if plan.batched else 1
        entry["actions"] = action
        pred = action if plan.batched else action[None]
    return {"output": [entry], "action_pred": _tensor(pred), **batch_meta}


def reply_for_result(plan: GroupPlan, result: protocol.GroupResult) -> bytes:
    try:
        return dumps_output_batch(**output_fields_for_result(plan, result))
    except CompatError as exc:
        return error_reply(str(exc))


# ---------------------------------------------------------------------------------------------------
# sglang's own HTTP server, pointed at the bridge (imports sglang)
# ---------------------------------------------------------------------------------------------------

_SHIMS_INSTALLED = False


def _action_value(values: Any, preserve_numpy: bool) -> dict[str, Any]:
    arr = np.asarray(values, dtype=np.float32)
    return {"type": "continuous", "dtype": "float32", "shape": list(arr.shape),
            "values": arr if preserve_numpy else arr.tolist()}


def relabel_candidate_response(output: dict[str, Any], response: dict[str, Any], *,
                               preserve_numpy: bool = False) -> dict[str, Any]:
    """Candidate labels for sglang's action envelope. sglang's `action_generation_response` numbers
    every row of ``actions`` as an input with ``candidate_index`` 0; for a candidate group the rows are
    candidates (candidate-major when there are several inputs). Adds ``candidate_group`` and, when
    candidates are listed, the served ``reduced_action``."""
    group = output.get("candidate_group") if isinstance(output, dict) else None
    if not isinstance(group, dict):
        return response
    inputs = int(group.get("num_inputs") or 1)
    if group.get("return_candidates"):
        for k, entry in enumerate(response.get("data", [])):
            entry["candidate_index"] = k // inputs
            entry["input_index"] = k % inputs
            entry["index"] = k
        reduced = output.get("reduced_actions")
        response["reduced_action"] = None if reduced is None else _action_value(reduced, preserve_numpy)
    response["candidate_group"] = {k: v for k, v in group.items() if k != "num_inputs"}
    response.setdefault("usage", {})["num_candidates"] = group.get("count")
    return response


def install_http_shims() -> None:
    """Two small wrappers in sglang's action endpoint (this process only; idempotent):

    - request: ``parameters.candidates`` of ``POST /v1/actions/generations`` is copied into the
      sampling params' ``diffusers_kwargs["candidates"]``, which ``prepare_request`` copies into
      ``Req.extra["diffusers_kwargs"]`` (sglang's Cosmos3 builder drops unknown parameters);
    - response: candidate rows get their ``candidate_index`` (sglang hard-codes 0), plus
      ``candidate_group`` and ``reduced_action`` (see `relabel_candidate_response`).
    """
    global _SHIMS_INSTALLED
    if _SHIMS_INSTALLED:
        return
    from sglang.multimodal_gen.runtime.entrypoints.action import api, protocol

    original_build = protocol.build_cosmos3_action_sampling_params
    original_response = api.action_generation_response
    original_raw = api.action_raw_response

    def build_with_candidates(payload, observation, server_args, sampling_params_cls):
        sp = original_build(payload, observation, server_args, sampling_params_cls)
        parameters = payload.get("parameters") or {}
        raw = parameters.get(CANDIDATE_SPEC_KEY)
        if raw is not None:
            try:
                spec = parse_candidate_spec(raw)
            except CompatError as exc:
                raise ValueError(str(exc)) from None  # sglang answers ValueError with HTTP 400
            sp.diffusers_kwargs = {**(sp.diffusers_kwargs or {}), CANDIDATE_SPEC_KEY: spec.to_dict()}
        return sp

    def generation_response(output, server_args, *, preserve_numpy=False):
        response = original_response(output, server_args, preserve_numpy=preserve_numpy)
        return relabel_candidate_response(output, response, preserve_numpy=preserve_numpy)

    def raw_response(output, *, preserve_numpy=False):
        response = original_raw(output, preserve_numpy=preserve_numpy)
        reduced = response.get("reduced_actions")
        if isinstance(reduced, np.ndarray) and not preserve_numpy:
            response["reduced_actions"] = reduced.tolist()
        return response

    protocol.build_cosmos3_action_sampling_params = build_with_candidates
    api.action_generation_response = generation_response
    api.action_raw_response = raw_response
    _SHIMS_INSTALLED = True


def make_http_server_args(compat_endpoint_port: int, model_dir: str, host: str = "127.0.0.1", port: int = 30000,
                          **server_kwargs: Any):
    """sglang ServerArgs for an HTTP-only server whose scheduler is the compat bridge on
    tcp://127.0.0.1:`compat_endpoint_port`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    from sglang.multimodal_gen.runtime.server_args import ServerArgs

    model_dir = os.path.abspath(str(model_dir))
    server_kwargs.setdefault("attention_backend", "torch_sdpa")
    sa = ServerArgs.from_kwargs(model_path=model_dir, host=host, port=int(port), **server_kwargs)
    # After construction: port settling would otherwise move an occupied (the bridge's!) port.
    sa.scheduler_ports = [int(compat_endpoint_port)]
    stats = os.path.join(model_dir, "action_stats.json")
    if os.path.exists(stats) and getattr(sa.pipeline_config, "action_stats_path", None) is None:
        sa.pipeline_config.action_stats_path = stats
    endpoint = f"tcp://127.0.0.1:{int(compat_endpoint_port)}"
    if sa.scheduler_endpoint != endpoint:
        # sglang derives the scheduler host from the public --host when it is a concrete address; the
        # bridge listens on loopback, so pin the internal hop there.
        sa.scheduler_endpoint_for = lambda replica=0: endpoint  # type: ignore[method-assign]
    return sa


def run_http_server(compat_endpoint_port: int, model_dir: str, host: str = "127.0.0.1", port: int = 30000,
                    **server_kwargs: Any) -> None:
    """Run sglang's own FastAPI server (blocking) with the compat bridge as its scheduler, so
    ``POST /v1/actions/generations`` (and /v1/actions/metadata, the websocket) are served by
    candidate_scheduler. Extra keyword arguments go to sglang's ServerArgs (e.g. warmup_mode,
    batching_max_size)."""
    sa = make_http_server_args(compat_endpoint_port, model_dir, host, port, **server_kwargs)
    install_http_shims()
    from sglang.multimodal_gen.runtime.launch_server import launch_http_server_only

    launch_http_server_only(sa)
