"""Pickling replies as sglang's own classes, without importing sglang.

The reply to an sglang client must unpickle as a real ``OutputBatch`` on the client side. Pickling a
dataclass writes ``GLOBAL module name; EMPTY_TUPLE; NEWOBJ; <state dict>; BUILD``; `dumps_foreign`
writes exactly that for a `ForeignObject` naming the class, so this process never needs the class.
"""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass
from typing import Any

from candidate_scheduler.compat.sglang_classes import OUTPUT_BATCH_DEFAULTS, SCHEDULE_BATCH

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
        if not (_GLOBAL_NAME.fullmatch(obj.module) and _GLOBAL_NAME.fullmatch(obj.name)):
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
    return dumps_foreign(ForeignObject(SCHEDULE_BATCH, "OutputBatch", {**OUTPUT_BATCH_DEFAULTS, **fields}))


def error_reply(message: str) -> bytes:
    return dumps_output_batch(error=str(message)[:4000])
