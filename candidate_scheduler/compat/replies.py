"""One native group result -> one sglang ``OutputBatch``, shaped like ``Cosmos3DecodingStage.forward``:
``output=[{request_id, actions [H, raw_dim], action_mode, domain_id, raw_action_dim, parameters}]``
plus ``action_pred`` (a torch tensor). Candidate groups add ``candidate_group``; see
docs/sglang-compat.md for every shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.foreign import dumps_output_batch, error_reply
from candidate_scheduler.compat.mapping import GroupPlan


def _as_float32(a: protocol.Array | np.ndarray | None, name: str) -> np.ndarray | None:
    if a is None:
        return None
    # a GroupResult off the wire, or a `Result` from AsyncClient (arrays decoded already)
    arr = a if isinstance(a, np.ndarray) else protocol.array_from_wire(a)
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
        "served_count": result.served_count if result.served_count is not None else spec.count,
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
