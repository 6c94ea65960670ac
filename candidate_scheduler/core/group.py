"""One candidate group in the engine: its lifecycle (GroupState), its request, who asked, what it cost.

`Group` is the one object the engine keeps per group. The lifecycle rules -- the transition table,
slices retried from snapshots, the reply handed out once -- stay in GroupState; this adds what the
scheduler needs around them: the validated request, the client reference to answer, folding a worker's
slice outcome (checked before anything is folded), and the reply in core terms.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from candidate_scheduler.core.access import DEFAULT_TENANT
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.group_state import GroupReply, GroupState, GroupStatus
from candidate_scheduler.core.messages import GroupResult, SliceOutcome
from candidate_scheduler.core.request import GroupRequest
from candidate_scheduler.core.work import ROLLOUT_FIELDS, ROLLOUT_META_FIELDS

# Admission rejections end the group FAILED inside GroupState; the client sees them as "rejected".
REJECT_CODES = frozenset({"unknown_reducer", "count_over_limit", "unsupported_action_mode", "does_not_fit",
                          "deadline_unmeetable"})


class Group(GroupState):
    def __init__(self, request: GroupRequest, client: Any, received_at: float, clock: Callable[[], float],
                 stopwatch: Callable[[], float] | None = None):
        deadline = None if request.deadline_s is None else received_at + max(0.0, float(request.deadline_s))
        super().__init__(request.request_id, request.spec, request.spec.candidate_seeds(request.seed),
                         deadline=deadline, clock=clock, stopwatch=stopwatch)
        self.request = request
        self.client = client
        self.waiters: list[Any] = []  # resubmissions of the same request id by its owner: same answer
        self.fingerprint: bytes | None = None  # of the SUBMIT's bytes (the shell's): what a resubmission must match
        self.received_at = received_at
        # what may share a batch / a forward with it, and its cost-model key: fixed by its sampling
        self.batch_key, self.forward_key, self.label = _keys(request.sampling)
        self.order: tuple = ()  # its place in the queue once admitted: (effective deadline, admission order)
        self.tenant = DEFAULT_TENANT  # whose limits and fair share it counts against (core/tenants.py)
        self.fair_tag: float | None = None  # its start tag while it waits, if it has no deadline
        self.fair_lead_s = 0.0  # its tenant's backlog ahead of it, added to its receipt time (core/fair_queue.py)
        self.serial = 0  # the engine's count of groups received when it came: tells it from a later namesake
        self.wire: Any = None  # the shell's encoded arrays of this group, made once (convert.GroupWire)
        self.forwards = 0
        self.physical_batches = 0
        self.co_batched = 0  # batches shared with other groups
        self.joins = 0  # slices that joined a running batch (step-level batching)
        self.first_step_s: float | None = None  # receipt -> its first denoise step
        self.condition_s = self.denoise_s = self.postprocess_s = 0.0
        self.worker_s = 0.0  # the workers' own receipt -> result time of its assignments (its share)
        self.steps_while_conditioned = 0  # steps the running batches took while its slices were conditioned
        # per assignment (batch id): label, rows, predicted and measured seconds; two slices of the group
        # in one assignment are one forecast
        self.forecasts: dict[int, tuple[str, int, float, float]] = {}
        self.rollout_parts: dict[int, dict[str, np.ndarray]] = {}
        self.rollout_meta: dict[str, np.ndarray] | None = None

    @property
    def sampling(self):
        return self.request.sampling

    # ---- a worker's outcome for one slice ------------------------------------------------------------

    def fold(self, slice_index: int, worker_id: str, out: SliceOutcome) -> bool:
        """Fold an "ok" outcome. Returns whether it was taken (False: late, or not this slice's
        worker). Raises CandidateContractError, changing nothing, when the outcome is malformed."""
        if out.malformed is not None:
            raise CandidateContractError("actions", "shape_mismatch", out.malformed)
        actions = out.actions
        # [n, B, horizon, raw_action_dim] exactly: the partial reducer takes its shape from the first slice
        # folded, so a wrong-shaped first slice would otherwise be served as "done"
        want = (self.request.observations, self.sampling.horizon, self.sampling.raw_action_dim)
        if actions is None or actions.ndim != 4 or tuple(actions.shape[1:]) != want:
            raise CandidateContractError("actions", "shape_mismatch", f"expected [n, {', '.join(map(str, want))}]",
                                         None if actions is None else list(actions.shape))
        parts = self._rollout_parts(out, len(out.candidate_ids))
        if not self.complete_slice(slice_index, worker_id, out.candidate_ids, actions):
            return False
        if parts is not None:
            for k, cid in enumerate(out.candidate_ids):
                self.rollout_parts[int(cid)] = {name: arr[k] for name, arr in parts.items()}
            if self.rollout_meta is None:
                self.rollout_meta = dict(out.rollout_meta)
        return True

    def _rollout_parts(self, out: SliceOutcome, n: int) -> dict[str, np.ndarray] | None:
        if not self.sampling.rollout:
            return None
        if out.rollout is None or set(out.rollout) != set(ROLLOUT_FIELDS) or out.rollout_meta is None \
                or set(out.rollout_meta) != set(ROLLOUT_META_FIELDS):
            raise CandidateContractError("rollout", "shape_mismatch", f"a rollout slice must carry {ROLLOUT_FIELDS}")
        # the group's reply stacks every candidate's arrays: each slice's must be shaped as the first's
        first = next(iter(self.rollout_parts.values()), None)
        for name, arr in out.rollout.items():
            if arr.ndim < 2 or arr.shape[0] != n or arr.shape[1] != self.request.observations:
                raise CandidateContractError("rollout", "shape_mismatch", f"{name} must be [n, B, ...]", list(arr.shape))
            if first is not None and arr.shape[1:] != first[name].shape:
                raise CandidateContractError("rollout", "shape_mismatch", f"{name} must be [n, "
                                             f"{', '.join(map(str, first[name].shape))}] as the group's other slices",
                                             list(arr.shape))
        if self.rollout_meta is not None:
            for name, arr in out.rollout_meta.items():
                if arr.shape != np.shape(self.rollout_meta[name]):
                    raise CandidateContractError("rollout_meta", "shape_mismatch", f"{name} must be shaped as the "
                                                 "group's other slices'", list(arr.shape))
        return dict(out.rollout)

    def account(self, report: dict, share: float) -> None:
        """A worker's report for an assignment this group was part of (`share` of its time)."""
        self.forwards += int(report.get("transformer_forwards", 0))
        self.condition_s += share * float(report.get("condition_s", 0.0))
        self.denoise_s += share * float(report.get("denoise_s", 0.0))
        self.postprocess_s += share * float(report.get("postprocess_s", 0.0))
        self.worker_s += share * float(report.get("wall_s", 0.0))
        self.steps_while_conditioned += int(report.get("steps_while_conditioned", 0))

    # ---- the reply -----------------------------------------------------------------------------------------

    def result(self, reply: GroupReply) -> GroupResult:
        def shaped(arr, candidate_axis: bool):
            if arr is None:
                return None
            arr = np.asarray(arr, dtype=np.float32)
            if not self.request.batched:  # one observation: drop the observation axis
                arr = arr[:, 0] if candidate_axis else arr[0]
            return arr

        metrics = dict(reply.metrics)
        metrics.update(
            physical_forwards=self.forwards,
            physical_batches=self.physical_batches,
            co_batched_batches=self.co_batched,
            joined_running_batches=self.joins,
            first_step_s=self.first_step_s,
            condition_s=self.condition_s,
            denoise_s=self.denoise_s,
            postprocess_s=self.postprocess_s,
            worker_s=self.worker_s,
            steps_while_conditioned=self.steps_while_conditioned,
            # the cost model's prediction of each of its assignments when it was sent, beside the time the
            # assignment took from send to result (0.0 predicted: the cost model was not calibrated yet)
            forecasts=[{"label": label, "rows": rows, "predicted_s": p, "measured_s": m}
                       for label, rows, p, m in self.forecasts.values()] or None,
        )
        status = reply.reason
        if reply.status is GroupStatus.FAILED and reply.error_code in REJECT_CODES:
            status = "rejected"
        return GroupResult(
            request_id=reply.request_id,
            status=status,
            action=shaped(reply.action, False),
            candidates=shaped(reply.candidates, True),
            candidate_seeds=tuple(reply.candidate_seeds),
            chosen_candidate=reply.chosen_candidate,
            error=reply.error_message,
            error_code=reply.error_code,
            metrics={k: v for k, v in metrics.items() if v is not None},
            rollout=self._rollout() if reply.status is GroupStatus.DONE else None,
            served_count=self.served_count if reply.status is GroupStatus.DONE else None,
        )

    def _rollout(self) -> dict[str, Any] | None:
        if not self.sampling.rollout or not self.rollout_parts or self.rollout_meta is None:
            return None
        ids = range(self.served_count)
        out: dict[str, Any] = {}
        for name in ROLLOUT_FIELDS:
            arr = np.stack([self.rollout_parts[c][name] for c in ids]).astype(np.float32, copy=False)
            out[name] = arr if self.request.batched else arr[:, 0]
        for name in ("sigmas", "timesteps"):
            out[name] = np.asarray(self.rollout_meta[name]).astype(np.float32, copy=False)
        out["step_indices"] = [int(i) for i in np.asarray(self.rollout_meta["step_indices"]).reshape(-1)]
        return out


@functools.lru_cache(maxsize=1024)
def _keys(sampling) -> tuple[tuple, tuple, str]:
    """A sampling spec's batch key, forward key and forward label (its groups share the spec object)."""
    return sampling.batch_key(), sampling.forward_key(), sampling.forward_label()


def refusal(request_id: str, status: str, code: str, message: str, field: str | None = None) -> GroupResult:
    """The reply to a group that was never admitted (invalid, rejected, overloaded)."""
    return GroupResult(request_id=request_id if isinstance(request_id, str) else "", status=status, error=message,
                       error_code=code, metrics={"error_field": field} if field else {})
