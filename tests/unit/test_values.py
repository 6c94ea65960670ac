"""core/values.py: `value` builds the same frozen dataclass as `dataclass(frozen=True)`, only faster."""

import dataclasses
import inspect
import typing
from dataclasses import KW_ONLY, InitVar, field

import pytest

from candidate_scheduler.core.values import value


def _both(body):
    """The same class body under `value` and under `dataclass(frozen=True)`."""
    return value(type("Fast", (), dict(body))), dataclasses.dataclass(frozen=True)(type("Plain", (), dict(body)))


def _post_init(self):
    object.__setattr__(self, "derived", self.a * 10 + len(self.made))


BODY = {
    "__annotations__": {"a": "int", "b": "int", "made": "list", "derived": "int", "fixed": "tuple", "fresh": "dict"},
    "b": 2,
    "made": field(default_factory=list),
    "derived": field(init=False),
    "fixed": field(default=(1,), init=False),
    "fresh": field(default_factory=dict, init=False),
    "__post_init__": _post_init,
}


@pytest.mark.parametrize("args, kwargs", [((1,), {}), ((1, 5), {}), ((1,), {"made": [3, 4]}), ((), {"a": 7, "b": 0})])
def test_the_same_instance_as_a_frozen_dataclass(args, kwargs):
    fast, plain = _both(BODY)
    f, p = fast(*args, **kwargs), plain(*args, **kwargs)
    assert vars(f) == vars(p)  # every field set as dataclass sets it
    assert repr(f).replace("Fast", "Plain") == repr(p)
    assert str(inspect.signature(fast)) == str(inspect.signature(plain))


def test_factories_make_a_new_default_per_instance_and_fields_stay_frozen():
    fast, _plain = _both(BODY)
    one, two = fast(1), fast(1)
    assert one.made is not two.made and one.fresh is not two.fresh
    assert one == two
    small, small_plain = _both({"__annotations__": {"a": "int", "b": "tuple"}, "b": ()})
    assert hash(small(1, (2,))) == hash(small(1, (2,))) == hash(small_plain(1, (2,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 2
    changed = dataclasses.replace(one, b=9)
    assert (changed.a, changed.b, changed.derived) == (1, 9, 10)


def test_an_init_false_field_without_a_default_is_left_unset_as_by_dataclass():
    body = {"__annotations__": {"a": "int", "later": "int"}, "later": field(init=False)}
    fast, plain = _both(body)
    assert vars(fast(1)) == vars(plain(1)) == {"a": 1}


def test_missing_arguments_are_refused_as_by_dataclass():
    fast, plain = _both(BODY)
    for cls in (fast, plain):
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls(1, derived=3)  # not an init field


@pytest.mark.parametrize("body", [
    {"__annotations__": {"a": int, "b": int}, "a": field(default=0, kw_only=True), "b": 1},
    {"__annotations__": {"a": int, "_": KW_ONLY, "b": int}},
    {"__annotations__": {"a": int, "scale": InitVar[int]}},
    {"__annotations__": {"a": int}, "__init__": lambda self, a: None},
], ids=["kw_only", "KW_ONLY", "InitVar", "own __init__"])
def test_what_its_init_would_not_reproduce_is_refused(body):
    with pytest.raises(TypeError, match="@value"):
        value(type("Refused", (), dict(body)))


def test_the_annotations_of_init_resolve_in_the_module():
    from candidate_scheduler.core.messages import GroupResult

    hints = typing.get_type_hints(GroupResult.__init__)
    assert hints["request_id"] is str and hints["return"] is type(None)
    assert list(inspect.signature(GroupResult.__init__).parameters)[0] == "self"
