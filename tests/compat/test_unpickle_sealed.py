"""Nothing the allow-list hands out can be changed by a pickle.

Every allow-listed global is one object shared by all clients for the life of the bridge; pickle's BUILD
opcode applies state to whatever it is given (``__setstate__``, else ``__dict__`` and setattr). Before the
objects were sealed, an 85-byte pickle setting ``DataType.__members_by_value__ = {}`` made every later
action request of every client fail."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from candidate_scheduler.compat.classify import classify
from candidate_scheduler.compat.errors import RefusedPickle
from candidate_scheduler.compat.mapping import plan_generation
from candidate_scheduler.compat.sglang_classes import TASK_TYPE
from candidate_scheduler.compat.unpickle import ALLOWED_GLOBALS, safe_loads
from tests.unit.test_sglang_compat import load, req


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _build(module: str, name: str, state: object) -> bytes:
    # GLOBAL module name; <state>; BUILD; STOP (the state pickled at protocol 2, without its header/STOP)
    return b"\x80\x02" + _global(module, name) + pickle.dumps(state, 2)[2:-1] + b"b."


def _snapshot(obj: object) -> dict:
    try:
        return dict(vars(obj))
    except TypeError:  # slots only: nothing to change
        return {}


STATES = [
    {"pwned": 1},  # dict state: written into __dict__
    (None, {"pwned": 1}),  # slot state: setattr
    (None, {"__members_by_value__": {}, "__defaults__": None, "__sglang_class__": "x", "_func": None}),
    ({"__kwdefaults__": {}}, None),
]


@pytest.mark.parametrize("key", sorted(ALLOWED_GLOBALS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_build_is_refused_on_every_allow_listed_global(key):
    obj = ALLOWED_GLOBALS[key]
    before = _snapshot(obj)
    for state in STATES:
        with pytest.raises(RefusedPickle):
            safe_loads(_build(*key, state))
    assert ALLOWED_GLOBALS[key] is obj
    assert _snapshot(obj) == before, f"BUILD changed {key}"
    assert not hasattr(obj, "pwned")
    with pytest.raises((RefusedPickle, TypeError, AttributeError)):  # nor can code here, by mistake
        obj.pwned = 1


def test_legitimate_requests_plan_after_the_attempts():
    dt = ALLOWED_GLOBALS[(TASK_TYPE, "DataType")]
    with pytest.raises(RefusedPickle):
        safe_loads(_build(TASK_TYPE, "DataType", (None, {"__members_by_value__": {}})))
    assert dt.__members_by_value__  # untouched
    plan_generation(classify(load(req())).reqs)


def test_a_dtype_rebuilt_to_hold_objects_is_refused():
    # numpy's dtype.__setstate__ takes flags; "holds objects" on a bytes dtype would read raw pickle
    # bytes as object pointers when the array is used
    payload = pickle.dumps(np.zeros(2, dtype="S8"), 2)
    assert b"K\x08K\x01K\x00tq" in payload
    hostile = payload.replace(b"K\x08K\x01K\x00tq", b"K\x08K\x08K\x01tq")
    with pytest.raises(RefusedPickle):
        safe_loads(hostile)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", ["uint8", ">f4", "<i8", "U3", "S5", "complex64", "bool"])
def test_numpy_arrays_and_scalars_still_load(protocol, dtype):
    arr = np.arange(6).astype(dtype).reshape(2, 3)
    out = safe_loads(pickle.dumps({"a": arr, "s": arr.flat[1], "t": np.asfortranarray(arr)}, protocol))
    for got in (out["a"], out["t"]):
        # numpy itself loads non-native byte order as native below protocol 5: compare the kind and values
        # (a dtype BUILD applied to numpy's shared builtin float32 was once ignored: ">f4" came back garbled)
        assert isinstance(got, np.ndarray) and got.dtype.str[1:] == arr.dtype.str[1:]
        assert np.array_equal(got, arr)
    assert out["s"] == arr.flat[1]
