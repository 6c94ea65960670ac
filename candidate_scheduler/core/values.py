"""Frozen dataclasses built at the cost of plain ones.

The engine's decisions and messages are values: frozen dataclasses (a unit of work, a worker's view, a
planning snapshot, a placement, a reply). CPython builds a frozen dataclass by calling
`object.__setattr__` once per field, about 1.6 us for ten fields against 0.3 us for a plain one on these
machines. A one-candidate group makes some 140 such fields on its way through the engine under step
batching (a unit, its worker's view and assignment views, a snapshot, a placement, a dispatch, a
reply...), so that alone was close to a tenth of what a group cost.

`value` is `dataclass(frozen=True)` with an `__init__` that fills the new instance's `__dict__`
directly: the same parameters, defaults, default factories and `__post_init__`, and the same class
afterwards -- assigning to a field still raises `FrozenInstanceError`, and equality, hashing, `repr`
and `dataclasses.replace` are dataclass's own.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TypeVar

T = TypeVar("T")


def value(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True)`, built faster (see the module docstring). Refuses what its `__init__`
    does not reproduce: keyword-only fields, init-only variables, a hand-written `__init__`."""
    if "__init__" in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: @value makes __init__; use @dataclass(frozen=True) for your own")
    cls = dataclasses.dataclass(frozen=True)(cls)
    # InitVar pseudo-fields are in __dataclass_fields__ but not in fields(): dataclass marks them so
    init_only = [name for name, f in cls.__dataclass_fields__.items()
                 if f._field_type is dataclasses._FIELD_INITVAR]  # noqa: SLF001
    keyword_only = [f.name for f in dataclasses.fields(cls) if f.kw_only]
    if init_only or keyword_only:
        raise TypeError(f"{cls.__qualname__}: @value makes no InitVar or keyword-only parameters "
                        f"({', '.join(init_only + keyword_only)}); use @dataclass(frozen=True)")
    cls.__init__ = _init_of(cls)
    return cls


def _init_of(cls: type):
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    me = "self" if "self" not in names else "__value_self__"  # as dataclass names it
    into = "__value_dict__"
    assert me not in names and into not in names
    # the module's names, so that typing.get_type_hints resolves the annotations of __init__
    scope: dict = {**vars(sys.modules[cls.__module__]), "__value_no_factory__": _NO_FACTORY}
    params, body = [me], [f"{into} = {me}.__dict__"]
    for f in fields:
        if f.default is not dataclasses.MISSING:
            scope[f"__value_default_{f.name}__"] = f.default
            given, made = f"__value_default_{f.name}__", None
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"__value_factory_{f.name}__"] = f.default_factory
            given, made = "__value_no_factory__", f"__value_factory_{f.name}__()"
        else:
            given = made = None
        if f.init:
            params.append(f.name if given is None else f"{f.name}={given}")
            if made is None:
                body.append(f"{into}[{f.name!r}] = {f.name}")
            else:  # dataclass's own rule: a factory's default is made per instance, when not given
                body.append(f"{into}[{f.name!r}] = {made} if {f.name} is __value_no_factory__ else {f.name}")
        elif made is not None:
            body.append(f"{into}[{f.name!r}] = {made}")
        # (an init=False field with a plain default is not set: as in dataclass, the class attribute answers)
    if hasattr(cls, "__post_init__"):
        body.append(f"{me}.__post_init__()")
    source = f"def __init__({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    exec(source, scope)  # noqa: S102 - generated from the class's own field names, as dataclasses does
    init = scope["__init__"]
    init.__annotations__ = {**{f.name: f.type for f in fields if f.init}, "return": None}
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


class _NoFactory:
    def __repr__(self) -> str:
        return "<factory>"


_NO_FACTORY = _NoFactory()
