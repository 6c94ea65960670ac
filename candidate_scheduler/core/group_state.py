"""The state machine of one candidate group.

Modelled on vLLM v1 ``request.py``: an ordered status IntEnum whose tail is the terminal region
(``is_finished(s) == s > REDUCING``) and one map from terminal status to public reason. Every status
change goes through `GroupState._transition`, which checks `ALLOWED_TRANSITIONS` and, on entering the
terminal region, builds the group's one reply. `take_reply` hands that reply out once and None after,
so a group is answered exactly once by construction.

Slices (from the admission decision) are the unit of work: each is pending, running on one worker, or
done. A result is folded only from the worker the slice is currently assigned to, only once; a failed
slice goes back to pending and is retried from the candidates' original snapshots (None = fresh from
the seed), never from a partly advanced generator. Reduction happens only once every candidate is done.

Not thread-safe: one owner (the scheduler's event loop) drives it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any

import numpy as np

from candidate_scheduler.core import reducers
from candidate_scheduler.core.admission import AdmissionDecision, AdmissionMode
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.spec import CandidateTrajectorySpec
from candidate_scheduler.core.values import value


class GroupStatus(enum.IntEnum):
    QUEUED = 0
    ADMITTED = 1
    RUNNING = 2
    REDUCING = 3
    # Terminal region: everything after REDUCING.
    DONE = 4
    FAILED = 5
    CANCELLED = 6
    EXPIRED = 7


def is_finished(status: GroupStatus) -> bool:
    return status > GroupStatus.REDUCING


# The one map from terminal status to the public reason string (reply status, metric label).
FINISHED_REASONS: Mapping[GroupStatus, str] = {
    GroupStatus.DONE: "done",
    GroupStatus.FAILED: "failed",
    GroupStatus.CANCELLED: "cancelled",
    GroupStatus.EXPIRED: "expired",
}

_ENDINGS = frozenset({GroupStatus.FAILED, GroupStatus.CANCELLED, GroupStatus.EXPIRED})
ALLOWED_TRANSITIONS: Mapping[GroupStatus, frozenset[GroupStatus]] = {
    GroupStatus.QUEUED: frozenset({GroupStatus.ADMITTED}) | _ENDINGS,  # FAILED = rejected at admission
    GroupStatus.ADMITTED: frozenset({GroupStatus.RUNNING}) | _ENDINGS,
    GroupStatus.RUNNING: frozenset({GroupStatus.REDUCING}) | _ENDINGS,
    GroupStatus.REDUCING: frozenset({GroupStatus.DONE}) | _ENDINGS,  # FAILED = the reducer raised
    GroupStatus.DONE: frozenset(),
    GroupStatus.FAILED: frozenset(),
    GroupStatus.CANCELLED: frozenset(),
    GroupStatus.EXPIRED: frozenset(),
}

# Error codes of runtime endings (contract rejections carry CandidateContractError codes instead).
ERROR_RETRIES_EXHAUSTED = "retries_exhausted"
ERROR_DEADLINE_EXCEEDED = "deadline_exceeded"
ERROR_CANCELLED = "cancelled"
INTERNAL_ERROR = "internal_error"  # the code of every answer to a fault inside the engine


class IllegalTransition(RuntimeError):
    """A status change the table does not allow: a scheduler bug, never a caller error."""


class WorkStatus(str, enum.Enum):
    """Status of one slice or one candidate."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


@value
class SliceDispatch:
    """Everything a worker needs to run one slice attempt; identical on every retry but `attempt`."""

    request_id: str
    slice_index: int
    attempt: int
    candidate_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    snapshots: tuple[bytes | None, ...]  # None: fresh torch.Generator(device).manual_seed(seed)


@value
class GroupReply:
    """The group's one answer. `action`/`candidates` are set only for DONE, never partially."""

    request_id: str
    status: GroupStatus
    reason: str
    candidate_seeds: tuple[int, ...]
    action: np.ndarray | None = None
    candidates: np.ndarray | None = None
    chosen_candidate: int | None = None
    error_code: str | None = None
    error_field: str | None = None
    error_message: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)


class _Slice:
    __slots__ = ("candidate_ids", "status", "attempts", "replans", "worker_id", "started_at")

    def __init__(self, candidate_ids: tuple[int, ...]) -> None:
        self.candidate_ids = candidate_ids
        self.status = WorkStatus.PENDING
        self.attempts = 0
        self.replans = 0  # of its attempts, those that ended in no fault of the worker's (out of memory)
        self.worker_id: str | None = None
        self.started_at: float | None = None


class GroupState:
    def __init__(
        self,
        request_id: str,
        spec: CandidateTrajectorySpec,
        seeds: Sequence[int],
        *,
        clock: Callable[[], float],  # injected: the engine's time, or a test's
        snapshots: Sequence[bytes | None] | None = None,
        deadline: float | None = None,
        stopwatch: Callable[[], float] | None = None,  # injected: times the reducer (default: the clock)
    ) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise CandidateContractError("request_id", "invalid_value", "must be a non-empty string", request_id)
        seeds = tuple(seeds)
        if len(seeds) != spec.count:
            raise CandidateContractError("seeds", "seeds_length", f"need count={spec.count} seeds", len(seeds))
        snapshots = (None,) * spec.count if snapshots is None else tuple(snapshots)
        if len(snapshots) != spec.count:
            raise CandidateContractError("snapshots", "seeds_length", f"need count={spec.count} snapshots", len(snapshots))
        self.request_id = request_id
        self.spec = spec
        self.seeds = seeds
        # Never replaced: a retry must start from exactly these states.
        self.snapshots: tuple[bytes | None, ...] = snapshots
        self.deadline = deadline
        self._clock = clock
        # The engine's clock stands still during an event, so work done inside one is timed with a
        # stopwatch the shell injects (a real one; the core reads no clock of its own).
        self._stopwatch = stopwatch or clock
        self._reducing_s = 0.0  # partial reductions so far
        self.status = GroupStatus.QUEUED
        self.decision: AdmissionDecision | None = None
        self.slices: tuple[tuple[int, ...], ...] = ()
        self._slices: list[_Slice] = []
        self.candidate_status: list[WorkStatus] = [WorkStatus.PENDING] * spec.count
        self.partial = reducers.PartialReduction(spec.reducer, spec.count)
        self.served_count = spec.count  # fewer under an elastic count (serve_first)
        self.created_at = clock()
        self.admitted_at: float | None = None
        self.first_started_at: float | None = None
        self.finished_at: float | None = None
        self.reducer_s: float | None = None
        self._reply: GroupReply | None = None
        self._reply_taken = False

    @classmethod
    def from_request(
        cls, request_id: str, spec: CandidateTrajectorySpec, base_seed: int, **kwargs: Any
    ) -> GroupState:
        return cls(request_id, spec, spec.candidate_seeds(base_seed), **kwargs)

    # --- the one place status changes -------------------------------------------------------------

    def _transition(self, new: GroupStatus, *, error: Mapping[str, str] | None = None) -> None:
        if new not in ALLOWED_TRANSITIONS[self.status]:
            raise IllegalTransition(f"group {self.request_id!r}: {self.status.name} -> {new.name} is not allowed")
        now = self._clock()
        self.status = new
        if new is GroupStatus.ADMITTED:
            self.admitted_at = now
        elif new is GroupStatus.RUNNING:
            self.first_started_at = now
        elif is_finished(new):
            self.finished_at = now
            try:
                self._reply = self._build_reply(new, error)
            except Exception as exc:
                # An ended group must have a reply, or nothing ever answers it (Endings takes the reply, once,
                # and forgets the group): it fails with the fault as its answer, and the fault is raised on
                # for the engine's guard to report.
                self.status = GroupStatus.FAILED
                self._reply = self._build_reply(GroupStatus.FAILED, {
                    "code": INTERNAL_ERROR, "field": None,
                    "message": f"the reply could not be built: {type(exc).__name__}: {exc}"})
                raise

    # --- lifecycle --------------------------------------------------------------------------------

    def admit(self, decision: AdmissionDecision) -> bool:
        """Apply an admission decision. A rejection ends the group (FAILED, with the error).
        Returns whether the group was admitted."""
        if self.status is not GroupStatus.QUEUED:
            raise IllegalTransition(f"group {self.request_id!r} is {self.status.name}; admission is for QUEUED groups")
        if decision.mode is AdmissionMode.REJECTED:
            err = decision.error  # never None for a rejection (AdmissionDecision checks)
            self.decision = decision
            self._transition(GroupStatus.FAILED, error={"code": err.code, "field": err.field, "message": str(err)})
            return False
        flat = sorted(c for s in decision.slices for c in s)
        if flat != list(range(self.spec.count)):
            # Admission never truncates; a decision for another count is a scheduler bug.
            raise CandidateContractError(
                "slices", "candidate_mismatch", f"slices must partition 0..{self.spec.count - 1}", decision.slices
            )
        self._transition(GroupStatus.ADMITTED)
        self.decision = decision
        self.slices = tuple(tuple(s) for s in decision.slices)
        self._slices = [_Slice(s) for s in self.slices]
        return True

    def serve_first(self, n: int, decision: AdmissionDecision) -> None:
        """Elastic count: serve candidates 0..n-1 only, sliced by `decision` (made for count n).

        Allowed only while ADMITTED and before any slice started, and for n in [min_count, count]. The
        seeds and snapshots are the first n of the full group's, so every served candidate is bitwise
        the one the full group would have served; the reducer then runs over those n."""
        if self.status is not GroupStatus.ADMITTED or any(s.attempts for s in self._slices):
            raise IllegalTransition(f"group {self.request_id!r}: the count is fixed once work has started")
        # checked before anything changes: a bad n must not leave the seeds cut and the slices not
        if isinstance(n, bool) or not isinstance(n, int) or not self.spec.min_count <= n <= self.spec.count:
            raise CandidateContractError("served_count", "invalid_count",
                                         f"must be in [{self.spec.min_count}, {self.spec.count}]", n)
        flat = sorted(c for s in decision.slices for c in s)
        if decision.mode is AdmissionMode.REJECTED or flat != list(range(n)):
            raise CandidateContractError("slices", "candidate_mismatch", f"slices must partition 0..{n - 1}",
                                         decision.slices)
        self.served_count = n
        self.seeds, self.snapshots = self.seeds[:n], self.snapshots[:n]
        self.candidate_status = self.candidate_status[:n]
        self.partial = reducers.PartialReduction(self.spec.reducer, n)
        self.decision = decision
        self.slices = tuple(tuple(s) for s in decision.slices)
        self._slices = [_Slice(s) for s in self.slices]

    def split_slice(self, slice_idx: int) -> int:
        """Halve a pending slice (a worker ran out of memory on it): slice `slice_idx` keeps the first
        half, the second half becomes a new slice at the end (indices of other slices never move).
        Returns the new slice's index. Both halves start again from their snapshots with fresh attempts."""
        if self.status not in (GroupStatus.ADMITTED, GroupStatus.RUNNING):  # its reply already counts its slices
            raise IllegalTransition(f"group {self.request_id!r} is {self.status.name}; cannot split slices")
        sl = self._slice(slice_idx)
        if sl.status is not WorkStatus.PENDING or len(sl.candidate_ids) < 2:
            raise IllegalTransition(f"slice {slice_idx} of {self.request_id!r} cannot be split")
        half = (len(sl.candidate_ids) + 1) // 2
        first, second = sl.candidate_ids[:half], sl.candidate_ids[half:]
        self._slices[slice_idx] = _Slice(first)
        self._slices.append(_Slice(second))
        self.slices = tuple(s.candidate_ids for s in self._slices)
        return len(self._slices) - 1

    def fit_pending(self, largest: int) -> bool:
        """Halve the pending slices until each fits `largest` rows (no live worker holds more); whether any
        was split."""
        todo = [i for i, ids in self.pending_slices() if len(ids) > largest]
        split = bool(todo)
        while todo:
            i = todo.pop()
            if len(self.slices[i]) > largest:
                todo += [i, self.split_slice(i)]
        return split

    def start_slice(self, slice_idx: int, worker_id: str) -> SliceDispatch:
        """Assign a pending slice to a worker; returns what to send it."""
        if self.status not in (GroupStatus.ADMITTED, GroupStatus.RUNNING):
            raise IllegalTransition(f"group {self.request_id!r} is {self.status.name}; cannot start slices")
        sl = self._slice(slice_idx)
        if sl.status is not WorkStatus.PENDING:
            raise IllegalTransition(f"slice {slice_idx} of {self.request_id!r} is {sl.status.value}, not pending")
        if self.status is GroupStatus.ADMITTED:
            self._transition(GroupStatus.RUNNING)
        sl.status = WorkStatus.RUNNING
        sl.attempts += 1
        sl.worker_id = worker_id
        sl.started_at = self._clock()
        for cid in sl.candidate_ids:
            self.candidate_status[cid] = WorkStatus.RUNNING
        return SliceDispatch(
            request_id=self.request_id,
            slice_index=slice_idx,
            attempt=sl.attempts,
            candidate_ids=sl.candidate_ids,
            seeds=tuple(self.seeds[c] for c in sl.candidate_ids),
            snapshots=tuple(self.snapshots[c] for c in sl.candidate_ids),
        )

    def complete_slice(
        self, slice_idx: int, worker_id: str, candidate_ids: Sequence[int], actions: Any
    ) -> bool:
        """Fold a slice's results. Returns False (and changes nothing) for a result the group no
        longer wants: group finished, slice not running, or running on another worker.

        Raises CandidateContractError (changing nothing) for a malformed result -- wrong candidate
        ids, wrong shapes, non-finite actions; the caller should then `fail_slice` it.
        When this completes the last candidate the group moves to REDUCING; call `finish`.
        """
        if self.status is not GroupStatus.RUNNING:  # ended (late result) or nothing started
            return False
        sl = self._slice(slice_idx)
        if sl.status is not WorkStatus.RUNNING or sl.worker_id != worker_id:
            return False
        ids = list(candidate_ids)
        # int() would take 1.7 or True as a candidate id; a slice's ids need not be sorted (admit takes
        # any partition), so both sides are compared sorted
        if any(type(c) is not int and (isinstance(c, bool) or not isinstance(c, (int, np.integer))) for c in ids) \
                or sorted(ids) != sorted(sl.candidate_ids):
            raise CandidateContractError(
                "candidate_ids", "candidate_mismatch", f"slice {slice_idx} holds {sl.candidate_ids}", tuple(ids)
            )
        started = self._stopwatch()
        self.partial.fold(ids, actions)
        self._reducing_s += self._stopwatch() - started
        sl.status = WorkStatus.DONE
        for cid in sl.candidate_ids:
            self.candidate_status[cid] = WorkStatus.DONE
        if self.partial.is_complete:
            self._transition(GroupStatus.REDUCING)
        return True

    def fail_slice(self, slice_idx: int, reason: str, retry_limit: int, *, worker_id: str | None = None,
                   counted: bool = True) -> bool:
        """A running slice failed (worker died, timed out, sent garbage).

        `retry_limit` caps the attempts per slice: with attempts < retry_limit the slice goes back to
        pending (to be retried from its snapshots), otherwise the whole group FAILS. With `worker_id`,
        a failure reported for a worker the slice is no longer on is ignored. `counted=False`: the attempt
        failed through no fault of the worker's (it ran out of memory, and holds fewer rows now): the slice
        goes back to pending, and the attempt never counts against `retry_limit` -- else a slice planned
        again after out-of-memory incidents failed at the first worker fault after them. Returns whether
        anything changed.
        """
        if is_finished(self.status):
            return False
        sl = self._slice(slice_idx)
        if sl.status is not WorkStatus.RUNNING or (worker_id is not None and sl.worker_id != worker_id):
            return False
        if not counted:
            sl.replans += 1
            self._back_to_pending(sl)
            return True
        if sl.attempts - sl.replans < retry_limit:
            self._back_to_pending(sl)
            return True
        self._transition(
            GroupStatus.FAILED,
            error={
                "code": ERROR_RETRIES_EXHAUSTED,
                "field": f"slice[{slice_idx}]",
                "message": f"slice {slice_idx} failed after {sl.attempts} attempt(s): {reason}",
            },
        )
        return True

    def return_slice(self, slice_idx: int, worker_id: str) -> bool:
        """A slice its worker gave back unstarted (it is leaving): pending again, and the attempt not
        counted -- nothing ran, so it neither nears the retry limit nor reads as a retry in the reply.
        Returns whether anything changed."""
        if is_finished(self.status):
            return False
        sl = self._slice(slice_idx)
        if sl.status is not WorkStatus.RUNNING or sl.worker_id != worker_id:
            return False
        sl.attempts -= 1
        self._back_to_pending(sl)
        return True

    def _back_to_pending(self, sl) -> None:
        sl.status = WorkStatus.PENDING
        sl.worker_id = None
        sl.started_at = None
        for cid in sl.candidate_ids:
            self.candidate_status[cid] = WorkStatus.PENDING

    def finish(self) -> bool:
        """Reduce a complete group and end it (DONE, or FAILED if the reducer raised).

        Returns False if the group already ended (e.g. cancelled while reducing); raises
        IllegalTransition before every candidate is done -- there is no partial aggregate.
        """
        if is_finished(self.status):
            return False
        if self.status is not GroupStatus.REDUCING:
            raise IllegalTransition(f"group {self.request_id!r} is {self.status.name}; cannot finish")
        started = self._stopwatch()
        try:
            self.partial.finalize()
        except CandidateContractError as exc:
            self.reducer_s = self._reducing_s + self._stopwatch() - started
            self._transition(GroupStatus.FAILED, error={"code": exc.code, "field": exc.field, "message": str(exc)})
            return True
        except Exception as exc:  # a registered reducer's own bug: this group fails, the engine keeps serving
            self.reducer_s = self._reducing_s + self._stopwatch() - started
            self._transition(GroupStatus.FAILED, error={"code": "reducer_error", "field": "reducer",
                                                         "message": f"{type(exc).__name__}: {exc}"})
            return True
        self.reducer_s = self._reducing_s + self._stopwatch() - started
        self._transition(GroupStatus.DONE)
        return True

    def fail(self, code: str, message: str, field: str = "request") -> bool:
        """End the group as FAILED for a reason no retry can fix (a bad observation, shutdown).
        Returns whether it changed anything."""
        if is_finished(self.status):
            return False
        self._transition(GroupStatus.FAILED, error={"code": code, "field": field, "message": message})
        return True

    def cancel(self) -> bool:
        """Cancel the group wherever it is. Idempotent: returns whether it changed anything."""
        if is_finished(self.status):
            return False
        self._transition(
            GroupStatus.CANCELLED, error={"code": ERROR_CANCELLED, "field": "request_id", "message": "cancelled"}
        )
        return True

    def expire(self, now: float | None = None) -> bool:
        """Expire the group if its deadline has passed. Returns whether it changed anything."""
        if is_finished(self.status) or self.deadline is None:
            return False
        now = self._clock() if now is None else now
        if now < self.deadline:
            return False
        self._transition(
            GroupStatus.EXPIRED,
            error={"code": ERROR_DEADLINE_EXCEEDED, "field": "deadline", "message": "deadline exceeded"},
        )
        return True

    def take_reply(self) -> GroupReply | None:
        """The group's reply, once: the first call after the group ended returns it, every other
        call returns None."""
        if self._reply is None or self._reply_taken:
            return None
        self._reply_taken = True
        return self._reply

    # --- queries ----------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return is_finished(self.status)

    @property
    def reply_taken(self) -> bool:
        return self._reply_taken

    def pending_slices(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(slice index, candidate ids) of every slice waiting for a worker, in slice order."""
        if self.status not in (GroupStatus.ADMITTED, GroupStatus.RUNNING):
            return ()
        return tuple((i, s.candidate_ids) for i, s in enumerate(self._slices) if s.status is WorkStatus.PENDING)

    def running_slices(self) -> dict[int, str]:
        """slice index -> worker id of slices assigned to a worker and not done. Still answers after
        the group ended (for STATUS and tests; the engine finds the workers to stop from its assignments)."""
        return {i: s.worker_id for i, s in enumerate(self._slices) if s.status is WorkStatus.RUNNING}

    def slices_on_worker(self, worker_id: str) -> tuple[int, ...]:
        return tuple(i for i, w in self.running_slices().items() if w == worker_id)

    def slice_status(self, slice_idx: int) -> WorkStatus:
        return self._slice(slice_idx).status

    def slice_attempts(self, slice_idx: int) -> int:
        return self._slice(slice_idx).attempts

    def slice_worker(self, slice_idx: int) -> str | None:
        return self._slice(slice_idx).worker_id

    def _slice(self, slice_idx: int) -> _Slice:
        if isinstance(slice_idx, bool) or not isinstance(slice_idx, int) or not 0 <= slice_idx < len(self._slices):
            raise CandidateContractError("slice_index", "invalid_value", f"group has {len(self._slices)} slices", slice_idx)
        return self._slices[slice_idx]

    # --- the reply --------------------------------------------------------------------------------

    def _build_reply(self, status: GroupStatus, error: Mapping[str, str] | None) -> GroupReply:
        action = candidates = chosen = None
        if status is GroupStatus.DONE:
            action = self.partial.finalize()  # cached by finish(); complete by construction here
            chosen = self.partial.chosen_candidate
            if self.spec.return_candidates or self.spec.reducer == reducers.NO_REDUCTION:
                candidates = self.partial.candidates()
        attempts = sum(s.attempts for s in self._slices)
        started_slices = sum(1 for s in self._slices if s.attempts)
        end = self.finished_at
        metrics = {
            "queue_wait_s": (self.first_started_at if self.first_started_at is not None else end) - self.created_at,
            "total_s": end - self.created_at,
            "admission_mode": None if self.decision is None else self.decision.mode.value,
            "microbatches": len(self._slices),
            "slice_attempts": attempts,
            "retries": attempts - started_slices,
            "reducer_s": self.reducer_s,
            "requested_count": self.spec.count,
            "served_count": self.served_count,
        }
        return GroupReply(
            request_id=self.request_id,
            status=status,
            reason=FINISHED_REASONS[status],
            candidate_seeds=self.seeds,
            action=action,
            candidates=candidates,
            chosen_candidate=chosen,
            error_code=None if error is None else error.get("code"),
            error_field=None if error is None else error.get("field"),
            error_message=None if error is None else error.get("message"),
            metrics=metrics,
        )
