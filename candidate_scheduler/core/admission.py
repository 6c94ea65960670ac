"""Admission: pure decisions about a candidate group, with a bounded reason string.

Order of checks: reducer supported by the model, count within the model's hard per-group limit,
action mode supported. Then: a group that fits one physical batch is admitted atomically; one that does
not is split per the configured policy (`microbatch`: balanced contiguous slices; `sequential`: one
candidate per slice, the documented low-memory fallback) or rejected (`reject`). A group is never
truncated: the slices always partition 0..count-1.
"""

from __future__ import annotations

import enum

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec, ModelCapability
from candidate_scheduler.core.values import value


class AdmissionPolicy(str, enum.Enum):
    MICROBATCH = "microbatch"
    SEQUENTIAL = "sequential"
    REJECT = "reject"


class AdmissionMode(str, enum.Enum):
    ATOMIC = "atomic"
    MICROBATCH = "microbatch"
    SEQUENTIAL = "sequential"
    REJECTED = "rejected"


# The closed set of reasons: safe as Prometheus label values (the detail lives in the error message).
REASON_FITS = "fits"
REASON_OVER_CAPACITY = "over_capacity"
REASON_DOES_NOT_FIT = "does_not_fit"
REASON_UNKNOWN_REDUCER = "unknown_reducer"
REASON_COUNT_OVER_LIMIT = "count_over_limit"
REASON_UNSUPPORTED_ACTION_MODE = "unsupported_action_mode"
ADMISSION_REASONS = (
    REASON_FITS,
    REASON_OVER_CAPACITY,
    REASON_DOES_NOT_FIT,
    REASON_UNKNOWN_REDUCER,
    REASON_COUNT_OVER_LIMIT,
    REASON_UNSUPPORTED_ACTION_MODE,
)


@value
class AdmissionDecision:
    mode: AdmissionMode
    slices: tuple[tuple[int, ...], ...]
    reason: str
    error: CandidateContractError | None = None

    def __post_init__(self) -> None:
        if self.reason not in ADMISSION_REASONS:
            raise AssertionError(f"unbounded admission reason {self.reason!r}")
        # A rejection carries an error and no work; an admission carries work and no error.
        if (self.mode is AdmissionMode.REJECTED) != (self.error is not None) or (
            (self.mode is AdmissionMode.REJECTED) == bool(self.slices)
        ):
            raise AssertionError(f"inconsistent admission decision {self!r}")

    @property
    def admitted(self) -> bool:
        return self.mode is not AdmissionMode.REJECTED


def split_balanced(count: int, capacity: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous slices of 0..count-1, as few as capacity allows, sizes differing by at most one
    (8 over 3 -> 3, 3, 2), larger slices first."""
    n_slices = -(-count // capacity)
    base, extra = divmod(count, n_slices)
    slices, start = [], 0
    for i in range(n_slices):
        size = base + (1 if i < extra else 0)
        slices.append(tuple(range(start, start + size)))
        start += size
    return tuple(slices)


def _reject(reason: str, error: CandidateContractError) -> AdmissionDecision:
    return AdmissionDecision(AdmissionMode.REJECTED, (), reason, error)


def decide(
    spec: CandidateTrajectorySpec,
    capability: ModelCapability,
    *,
    action_mode: str,
    policy: AdmissionPolicy | str = AdmissionPolicy.MICROBATCH,
    batch_capacity: int | None = None,
) -> AdmissionDecision:
    """Decide how to run `spec` on a worker with `capability`.

    `batch_capacity` is the worker's candidate capacity per physical batch (e.g. its memory budget);
    the effective capacity is the smaller of it and the model's `max_candidates_per_batch`.
    Contract violations come back as a REJECTED decision carrying the error, not as a raise.
    """
    policy = AdmissionPolicy(policy)
    capacity = capability.max_candidates_per_batch if batch_capacity is None else batch_capacity
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        # The caller's configuration, not the request, is wrong: raise.
        raise CandidateContractError("batch_capacity", "invalid_value", "must be an int >= 1", batch_capacity)
    capacity = min(capacity, capability.max_candidates_per_batch)
    count = spec.count

    if not capability.supports_reducer(spec.reducer):
        return _reject(
            REASON_UNKNOWN_REDUCER,
            CandidateContractError(
                "reducer", "unknown_reducer",
                f"model {capability.model_name!r} supports reducers {('none',) + capability.reducers}",
                spec.reducer,
            ),
        )
    if count > capability.max_candidates_per_group:
        return _reject(
            REASON_COUNT_OVER_LIMIT,
            CandidateContractError(
                "count", "count_over_limit",
                f"model {capability.model_name!r} allows at most {capability.max_candidates_per_group} "
                "candidates per group",
                count,
            ),
        )
    if action_mode not in capability.action_modes:
        return _reject(
            REASON_UNSUPPORTED_ACTION_MODE,
            CandidateContractError(
                "action_mode", "unsupported_action_mode",
                f"model {capability.model_name!r} supports action modes {capability.action_modes}",
                action_mode,
            ),
        )
    if count <= capacity:
        return AdmissionDecision(AdmissionMode.ATOMIC, (tuple(range(count)),), REASON_FITS)
    if policy is AdmissionPolicy.MICROBATCH:
        return AdmissionDecision(AdmissionMode.MICROBATCH, split_balanced(count, capacity), REASON_OVER_CAPACITY)
    if policy is AdmissionPolicy.SEQUENTIAL:
        return AdmissionDecision(
            AdmissionMode.SEQUENTIAL, tuple((i,) for i in range(count)), REASON_OVER_CAPACITY
        )
    return _reject(
        REASON_DOES_NOT_FIT,
        CandidateContractError(
            "count", "does_not_fit",
            f"group does not fit one physical batch of {capacity} candidates and the admission policy is "
            "'reject' (it is never truncated)",
            count,
        ),
    )
