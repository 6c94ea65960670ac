"""Fault injection for worker adapters: reliability tests and drills only, never production.

`FaultyAdapter` wraps any step adapter (worker/stepping.py) and, with configured probabilities per
assignment (one BATCH or JOIN), makes the worker answer the way a broken one would: malformed or
wrong-shaped actions, candidate ids that are not the slice's, a missing or extra output, an output for
another request, a bogus status, or an exception out of the model. The scheduler must notice every one
of them, retry the slice from its snapshots, and still answer each group exactly once with the
fault-free result (a worker cannot lie undetectably about *values*, so no fault here changes values
while keeping the shape; `shuffle` reorders rows together with their ids, which is legal).

    candidate-scheduler worker --adapter null --fault malformed:0.3,raise:0.1,seed=7

Spec grammar: comma-separated `KIND:PROBABILITY` items plus an optional `seed=INT` and an optional
`oom_rows=N`: every assignment holding more than N candidate rows answers out_of_memory, like a device
that cannot hold them (the scheduler must re-plan smaller slices, not fail the group). Probabilities are
per assignment; at most one fault is injected per batch (so they must sum to <= 1). Kinds:

    raise          a transient fault (the worker answers worker_error for every group of the assignment)
    wrong_shape    actions with a wrong horizon or action dimension (consistent across rows)
    wrong_batch    actions whose observation axis has the wrong length
    wrong_ids      candidate ids that are not the slice's (shifted, duplicated or one short)
    nan            a non-finite value in the actions
    no_actions     status "ok" without actions
    wrong_request  an output that names another request
    bad_status     an unknown status string
    drop_output    one output fewer than the batch has groups
    extra_output   one output more than the batch has groups
    shuffle        candidate rows permuted together with their ids (benign: the result must not change)
    malformed      one of the malformed kinds above (not raise, not shuffle), chosen at random

Every injected fault is logged as one line `fault-injected kind=KIND ...` (logger
``candidate_scheduler.faults``, WARNING), so a test can count them from the worker's output.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from candidate_scheduler.worker.stepping import OutOfMemory, TransientFault, error_output

log = logging.getLogger("candidate_scheduler.faults")

MALFORMED_KINDS = (
    "wrong_shape",
    "wrong_batch",
    "wrong_ids",
    "nan",
    "no_actions",
    "wrong_request",
    "bad_status",
    "drop_output",
    "extra_output",
)
KINDS = MALFORMED_KINDS + ("raise", "shuffle", "malformed")


class InjectedFault(TransientFault):
    """What the `raise` fault stands for: a transient worker failure, which the scheduler retries."""


@dataclass(frozen=True)
class FaultSpec:
    probabilities: tuple[tuple[str, float], ...] = ()
    seed: int | None = None
    oom_rows: int | None = None

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        probs: list[tuple[str, float]] = []
        seed = oom_rows = None
        for raw in str(text).split(","):
            item = raw.strip()
            if not item:
                continue
            if item.startswith("oom_rows="):
                try:
                    oom_rows = int(item[len("oom_rows="):])
                except ValueError:
                    raise ValueError(f"bad oom_rows in {item!r}") from None
                continue
            if item.startswith("seed="):
                try:
                    seed = int(item[len("seed="):])
                except ValueError:
                    raise ValueError(f"bad fault seed in {item!r}") from None
                continue
            kind, sep, p = item.partition(":")
            kind = kind.strip()
            if kind not in KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; kinds: {', '.join(KINDS)}")
            try:
                prob = float(p) if sep else 1.0
            except ValueError:
                raise ValueError(f"bad probability in {item!r}") from None
            if not 0.0 <= prob <= 1.0:
                raise ValueError(f"probability of {kind!r} must be in [0, 1], got {prob}")
            probs.append((kind, prob))
        if sum(p for _k, p in probs) > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities sum to {sum(p for _k, p in probs):.3f} > 1 (one fault per batch)")
        return cls(tuple(probs), seed, oom_rows)

    def __str__(self) -> str:
        items = [f"{k}:{p:g}" for k, p in self.probabilities]
        if self.seed is not None:
            items.append(f"seed={self.seed}")
        if self.oom_rows is not None:
            items.append(f"oom_rows={self.oom_rows}")
        return ",".join(items)


def _failed(outputs: list, fault: BaseException) -> list:
    """Every output of the assignment (an undecodable group has an output and no item) that would have
    succeeded answered with `fault`; one already failed for good (a bad request) or cancelled stays as it is:
    replaced, a bad request was retried as a worker fault and ended `retries_exhausted`."""
    return [error_output(o.request_id, fault) if o.status == "ok" else o for o in outputs]


@dataclass
class FaultyAdapter:
    """Wraps `inner`; `spec` is a FaultSpec or its text form. `injected` counts faults by kind."""

    inner: Any
    spec: FaultSpec | str
    injected: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.spec, str):
            self.spec = FaultSpec.parse(self.spec)
        self._rng = random.Random(self.spec.seed)
        log.warning("fault injection armed: %s", self.spec)

    # -- the adapter protocol ----------------------------------------------------------------------------
    def capability_dict(self) -> dict:
        return self.inner.capability_dict()

    def __getattr__(self, name: str) -> Any:  # anything else the worker may ask the real adapter
        if name in ("inner", "spec", "injected", "_rng"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def mangle_result(self, items, outputs: list) -> list:
        """The worker loop's hook on every assignment's outputs, just before they are sent: at most one
        fault per assignment, drawn with the configured probabilities."""
        rows = sum(len(it.candidates) * len(it.images) for it in items)
        if self.spec.oom_rows is not None and rows > self.spec.oom_rows:
            self._note("oom", items, f"{rows} rows > {self.spec.oom_rows}")
            fault = OutOfMemory(f"injected: {rows} rows do not fit (oom_rows={self.spec.oom_rows})")
            return _failed(outputs, fault)
        kind = self._draw()
        if kind is None:
            return outputs
        if kind == "raise":
            self._note(kind, items, "")
            return _failed(outputs, InjectedFault("injected fault: the adapter raised"))
        if kind == "malformed":
            kind = self._rng.choice(MALFORMED_KINDS)
        outputs = list(outputs)
        detail = self._apply(kind, items, outputs)
        if detail is None:  # nothing to corrupt (e.g. every group was cancelled)
            return outputs
        self._note(kind, items, detail)
        return outputs

    # -- internals -------------------------------------------------------------------------------------------
    def _draw(self) -> str | None:
        u = self._rng.random()
        acc = 0.0
        for kind, p in self.spec.probabilities:
            acc += p
            if u < acc:
                return kind
        return None

    def _note(self, kind: str, items, detail: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1
        groups = ",".join(getattr(it, "request_id", "?") for it in items)
        log.warning("fault-injected kind=%s groups=%s %s", kind, groups[:200], detail)

    def _apply(self, kind: str, items, outputs: list) -> str | None:
        if kind == "drop_output":
            if not outputs:
                return None
            outputs.pop(self._rng.randrange(len(outputs)))
            return "dropped one output"
        if kind == "extra_output":
            if not outputs:
                return None
            outputs.append(replace(outputs[self._rng.randrange(len(outputs))]))
            return "duplicated one output"
        ok = [i for i, o in enumerate(outputs) if o.status == "ok" and o.actions is not None]
        if not ok:
            return None
        i = self._rng.choice(ok)
        out = outputs[i]
        actions = np.array(out.actions, dtype=np.float32, copy=True)  # [n, B, H, D]
        ids = list(out.candidate_ids)
        if kind == "wrong_shape":
            if self._rng.random() < 0.5 and actions.shape[-1] > 1:
                bad = actions[..., :-1]
            else:
                bad = np.concatenate([actions, actions[:, :, :1]], axis=2)  # one more horizon step
            outputs[i] = replace(out, actions=np.ascontiguousarray(bad))
            return f"actions {list(actions.shape)} -> {list(bad.shape)}"
        if kind == "wrong_batch":
            bad = np.concatenate([actions, actions[:, :1]], axis=1)
            outputs[i] = replace(out, actions=bad)
            return f"actions {list(actions.shape)} -> {list(bad.shape)}"
        if kind == "wrong_ids":
            how = self._rng.choice(("shift", "duplicate", "short"))
            if how == "duplicate" and len(ids) > 1:
                bad_ids = [ids[0]] + ids[:-1]
                outputs[i] = replace(out, candidate_ids=bad_ids)
            elif how == "short" and len(ids) > 1:
                outputs[i] = replace(out, candidate_ids=ids[:-1], actions=actions[:-1])
                bad_ids = ids[:-1]
            else:
                bad_ids = [c + len(ids) + 1000 for c in ids]
                outputs[i] = replace(out, candidate_ids=bad_ids)
            return f"candidate ids {ids} -> {bad_ids}"
        if kind == "nan":
            flat = actions.reshape(-1)
            flat[self._rng.randrange(flat.size)] = self._rng.choice((np.nan, np.inf, -np.inf))
            outputs[i] = replace(out, actions=actions)
            return "a non-finite action value"
        if kind == "no_actions":
            outputs[i] = replace(out, actions=None)
            return "status ok without actions"
        if kind == "wrong_request":
            outputs[i] = replace(out, request_id=out.request_id + "-not-mine")
            return "output names another request"
        if kind == "bad_status":
            outputs[i] = replace(out, status=self._rng.choice(("", "OK", "done", "partial", "\x00")), actions=None)
            return f"status {outputs[i].status!r}"
        if kind == "shuffle":
            perm = list(range(len(ids)))
            self._rng.shuffle(perm)
            outputs[i] = replace(out, candidate_ids=[ids[p] for p in perm], actions=actions[perm])
            return f"rows permuted {perm}"
        raise ValueError(f"unknown fault kind {kind!r}")


def wrap(adapter: Any, spec: str | None) -> Any:
    """`adapter` unchanged without a spec, else wrapped (the worker CLI's `--fault`)."""
    if not spec:
        return adapter
    return FaultyAdapter(adapter, spec)
