"""Reducer registry and split-invariant streaming reduction.

A reducer maps the stacked candidates of one group, ``float64 [N, ...]`` in candidate-id order, to one
action ``[...]`` (or to None for ``none``). Built-ins:

- ``none``: no reduction; every candidate is returned and the served action is None.
- ``mean``: elementwise mean, summed row by row in candidate-id order in float64.
- ``median``: elementwise median (mean of the two middle values for even N).
- ``medoid``: the REAL candidate with the smallest total L2 distance (over the flattened trajectory)
  to the others; ties go to the lowest candidate id. Averaging two modes of a multimodal action
  distribution gives an action nobody proposed (and that may collide with an obstacle both modes
  avoid); the medoid is always something the policy actually proposed.

Split invariance: `PartialReduction` keeps each candidate's array, keyed by id, as slices arrive, and
reduces once every candidate is present, over the rows stacked in id order. Float addition is not
associative, so folding running sums per microbatch would make the result depend on how the group was
split and in which order slices finished; buffering costs N small action arrays (which
``return_candidates`` needs anyway, as do median and medoid) and makes the result bit-identical to the
one-shot `reduce` on the same candidates, however they arrived.

Served actions are float32, computed in float64.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.values import value

NO_REDUCTION = "none"
BUILTIN_REDUCERS = ("none", "mean", "median", "medoid")
OUTPUT_DTYPE = np.float32
_SERVABLE = float(np.finfo(np.float32).max)  # the largest magnitude a served (float32) action holds

# Reducer names appear in metric labels and on the wire: keep them short and plain.
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@value
class Reduction:
    """What a reducer returns: the action (None for ``none``) and, for selection reducers such as
    medoid, the row index of the candidate that was served (== candidate id within a group)."""

    action: np.ndarray | None
    chosen_candidate: int | None = None


ReducerFn = Callable[[np.ndarray], "np.ndarray | Reduction | None"]

_REGISTRY: dict[str, ReducerFn] = {}


def _reduce_none(stacked: np.ndarray) -> Reduction:
    return Reduction(None)


def _reduce_mean(stacked: np.ndarray) -> np.ndarray:
    # Explicit row loop: a fixed summation order (candidate-id order), independent of numpy's
    # pairwise/SIMD strategy for np.sum. It starts from the first row plus 0.0 in float64, which is bitwise
    # the sum from zeros (0.0 + x is x + 0.0, -0.0 included) without making and adding a row of zeros.
    acc = np.add(stacked[0], 0.0, dtype=np.float64)
    for row in stacked[1:]:
        acc += row
    return acc / stacked.shape[0]


def _reduce_median(stacked: np.ndarray) -> np.ndarray:
    return np.median(stacked, axis=0)


def _reduce_medoid(stacked: np.ndarray) -> Reduction:
    flat = stacked.reshape(stacked.shape[0], -1)
    totals = np.empty(flat.shape[0], dtype=np.float64)
    for i in range(flat.shape[0]):
        # (x_i - x_j)^2 == (x_j - x_i)^2 exactly, so the distance matrix is exactly symmetric. Each row
        # holds its distances in a different order, and a left-to-right float sum depends on the order
        # (two mirror-image candidates with bitwise the same distances got different totals, and the
        # higher id won); fsum is correctly rounded, so equal distances give equal totals and ties are
        # real ties, broken by argmin's first (lowest) index.
        totals[i] = math.fsum(np.sqrt(np.sum((flat - flat[i]) ** 2, axis=1)).tolist())
    chosen = int(np.argmin(totals))
    return Reduction(stacked[chosen].copy(), chosen)


def register_reducer(name: str, fn_or_class: Any, *, overwrite: bool = False) -> None:
    """Register a model reducer.

    `fn_or_class` is a callable ``f(stacked_float64[N, ...]) -> ndarray[...] | Reduction``, or a class
    whose no-argument instance is such a callable. It must be deterministic and must not mutate its
    input. Built-ins cannot be replaced; another name needs ``overwrite=True`` to be replaced.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise CandidateContractError(
            "reducer", "invalid_value", "reducer name must match [a-z][a-z0-9_]{0,63}", name
        )
    fn = fn_or_class() if isinstance(fn_or_class, type) else fn_or_class
    if not callable(fn):
        raise CandidateContractError("reducer", "invalid_type", "reducer must be callable", fn_or_class)
    if name in BUILTIN_REDUCERS:
        raise CandidateContractError("reducer", "reducer_exists", "built-in reducers cannot be replaced", name)
    if name in _REGISTRY and not overwrite:
        raise CandidateContractError(
            "reducer", "reducer_exists", "reducer already registered (pass overwrite=True)", name
        )
    _REGISTRY[name] = fn


def unregister_reducer(name: str) -> bool:
    """Remove a model reducer (built-ins stay). Returns whether anything was removed."""
    if name in BUILTIN_REDUCERS:
        raise CandidateContractError("reducer", "reducer_exists", "built-in reducers cannot be removed", name)
    return _REGISTRY.pop(name, None) is not None


def is_registered(name: object) -> bool:
    return isinstance(name, str) and name in _REGISTRY


def registered_reducers() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get_reducer(name: str) -> ReducerFn:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise CandidateContractError(
            "reducer", "unknown_reducer", f"registered reducers are {registered_reducers()}", name
        ) from None


def reduce_full(name: str, stacked: Any) -> Reduction:
    """One-shot reduction of ``stacked [N, ...]`` (rows in candidate-id order), with metadata."""
    fn = get_reducer(name)
    arr = np.asarray(stacked)
    if arr.ndim < 1 or arr.shape[0] < 1:
        raise CandidateContractError("candidates", "invalid_count", "need at least one candidate", arr.shape)
    arr64 = np.array(arr, dtype=np.float64, copy=True)  # a private copy: reducers may not mutate ours
    out = fn(arr64)
    if isinstance(out, Reduction):
        action, chosen = out.action, out.chosen_candidate
    else:
        action, chosen = out, None
    if action is None:
        if name != NO_REDUCTION:
            raise CandidateContractError("reducer", "bad_reducer_output", "reducer returned no action", name)
        return out if isinstance(out, Reduction) else Reduction(None)
    action = np.asarray(action)
    if action.shape != arr.shape[1:]:
        raise CandidateContractError(
            "reducer", "bad_reducer_output",
            f"{name!r} returned shape {action.shape}, expected {arr.shape[1:]}", name,
        )
    if chosen is not None:
        # a model reducer's np.argmin is a numpy integer, which the reply's wire encoding refuses
        if isinstance(chosen, (bool, np.bool_)) or not isinstance(chosen, (int, np.integer)):
            raise CandidateContractError("reducer", "bad_reducer_output", "chosen_candidate must be an int",
                                         repr(chosen))
        chosen = int(chosen)
        if not 0 <= chosen < arr.shape[0]:
            raise CandidateContractError("reducer", "bad_reducer_output", "chosen_candidate out of range", chosen)
    if not (np.abs(action) <= _SERVABLE).all():  # NaN fails the comparison too
        # Finite candidates can still reduce to inf (a float64 mean that overflows, a value beyond
        # float32's range) and a model reducer can return NaN: never served, as fold never takes one.
        raise CandidateContractError("reducer", "non_finite", f"{name!r} returned a non-finite action", name)
    return Reduction(action.astype(OUTPUT_DTYPE), chosen)


def reduce(name: str, stacked: Any) -> np.ndarray | None:
    """One-shot reduction; bit-identical to a `PartialReduction` fed the same candidates."""
    return reduce_full(name, stacked).action


class PartialReduction:
    """Candidates of one group folded in as microbatches finish, in any order.

    `fold` is all-or-nothing: a bad call (unknown or duplicate id, wrong shape, non-finite values)
    raises before anything is recorded. `finalize` refuses an incomplete group: never a partial
    aggregate.
    """

    def __init__(self, reducer_name: str, count: int) -> None:
        get_reducer(reducer_name)  # fail now, not when the last slice arrives
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise CandidateContractError("count", "invalid_count", "count must be an int >= 1", count)
        self.reducer_name = reducer_name
        self.count = count
        self._rows: dict[int, np.ndarray] = {}
        self._shape: tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None
        self._result: Reduction | None = None

    def fold(self, candidate_ids: Sequence[int], arrays: Any) -> None:
        ids = list(candidate_ids)
        if not hasattr(arrays, "__len__") or isinstance(arrays, np.ndarray) and arrays.ndim == 0:
            raise CandidateContractError("arrays", "shape_mismatch", "need one array per candidate id", repr(arrays)[:80])
        if len(arrays) != len(ids):
            raise CandidateContractError(
                "arrays", "shape_mismatch", f"{len(ids)} candidate ids but {len(arrays)} arrays", len(arrays)
            )
        seen: set[int] = set()
        rows: list[tuple[int, np.ndarray]] = []
        # Every candidate of a group must share one shape and dtype; the first row ever folded sets it.
        expected = None if self._shape is None else (self._shape, self._dtype)
        if len(ids) > 1 and isinstance(arrays, np.ndarray) and arrays.dtype.kind in "fiu":
            # A worker's slice arrives as one array: copied and checked once, not row by row (a slice of 8
            # folds in about half the time); the checks and their order per row are those of the loop below.
            arrays = np.array(arrays, copy=True, order="C")
            finite = np.isfinite(arrays.reshape(len(ids), -1)).all(axis=1)
        else:
            finite = None
        for k, (cid, raw) in enumerate(zip(ids, arrays)):
            if isinstance(cid, bool) or not isinstance(cid, (int, np.integer)) or not 0 <= cid < self.count:
                raise CandidateContractError(
                    "candidate_ids", "unknown_candidate", f"ids must be in 0..{self.count - 1}", cid
                )
            cid = int(cid)
            if cid in seen or cid in self._rows:
                raise CandidateContractError("candidate_ids", "duplicate_candidate", "candidate already folded", cid)
            seen.add(cid)
            arr = raw if finite is not None else np.array(raw, copy=True)  # the caller may reuse its buffer
            if arr.dtype.kind not in "fiu":  # real numbers: float, signed or unsigned int
                raise CandidateContractError(f"arrays[{cid}]", "invalid_type", "actions must be real numbers", str(arr.dtype))
            if expected is None:
                expected = (arr.shape, arr.dtype)
            if (arr.shape, arr.dtype) != expected:
                raise CandidateContractError(
                    f"arrays[{cid}]", "shape_mismatch", f"expected {expected[1]}{list(expected[0])}",
                    f"{arr.dtype}{list(arr.shape)}",
                )
            if not (finite[k] if finite is not None else np.isfinite(arr).all()):
                # A NaN/inf action must never be served (nor poison a mean or a medoid distance).
                raise CandidateContractError(f"arrays[{cid}]", "non_finite", "candidate action is not finite", cid)
            rows.append((cid, arr))
        for cid, arr in rows:
            self._rows[cid] = arr
        if expected is not None and self._shape is None and rows:
            self._shape, self._dtype = expected

    @property
    def is_complete(self) -> bool:
        return len(self._rows) == self.count

    def done(self) -> tuple[int, ...]:
        return tuple(sorted(self._rows))

    def missing(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.count) if i not in self._rows)

    def candidates(self) -> np.ndarray:
        """All candidates stacked in id order, in the dtype they arrived in (complete groups only)."""
        self._require_complete()
        return np.stack([self._rows[i] for i in range(self.count)])

    def finalize(self) -> np.ndarray | None:
        """The reduced action (float32; None for ``none``). Raises unless every candidate is folded."""
        self._require_complete()
        if self._result is None:
            # one candidate: a view of its row, not np.stack (half the cost of a one-candidate reduction;
            # reduce_full copies what it reduces, so nothing here is shared with the caller)
            stacked = self._rows[0][None] if self.count == 1 else self.candidates()
            self._result = reduce_full(self.reducer_name, stacked)
        return self._result.action

    @property
    def chosen_candidate(self) -> int | None:
        """For selection reducers (medoid): the candidate id served. None before finalize."""
        return None if self._result is None else self._result.chosen_candidate

    def _require_complete(self) -> None:
        if not self.is_complete:
            raise CandidateContractError(
                "candidate_ids", "incomplete_group", "refusing to reduce a partial group; missing", self.missing()
            )


for _name, _fn in (("none", _reduce_none), ("mean", _reduce_mean), ("median", _reduce_median), ("medoid", _reduce_medoid)):
    _REGISTRY[_name] = _fn
del _name, _fn
