"""The rows the live workers may hold, kept between changes to them, and what admission decides from them.

A group is sized for the fleet when it is admitted (core/admission.decide): for the smallest live worker,
so that each slice runs anywhere (a larger worker co-batches several), or under `--policy reject`, where a
group runs whole on one worker or not at all, for the largest. A slice no live worker can hold any more
(the largest shrank after running out of memory, or left) is halved (Engine._fit_slices). And a forward
shape one candidate of which ran a worker out of memory is not sent there again (core/worker_link.py):
when every live worker refuses a shape, a group of it is refused at admission instead of queued for a
worker that will not come.

All of it changes only when a worker comes or goes or the rows one may hold change (`changed`), so it is
computed once per such change (`current`), not per group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from candidate_scheduler.core.admission import (
    REASON_DOES_NOT_FIT,
    AdmissionDecision,
    AdmissionMode,
    AdmissionPolicy,
    decide,
)
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.workers import WorkerState


class FleetRows:
    def __init__(self, rows_of: Callable[[WorkerState], int]) -> None:
        self.rows_of = rows_of  # the rows a worker may hold now: its capacity, capped by predicted memory
        self.epoch = 0  # bumped at every change: views and forecasts built in another epoch are stale
        self._stale = True
        self.largest = 0  # the largest live worker's rows: no pending slice may be larger (Engine._fit_slices)
        self.smallest_worker: WorkerState | None = None
        self.largest_worker: WorkerState | None = None
        self.refused_everywhere: frozenset[str] = frozenset()  # forward labels no live worker takes
        # forward labels some live workers refuse -> the largest that takes it, and its rows: a slice of one
        # must fit that worker, not the largest (which may be one that refuses it)
        self.largest_taker: dict[str, WorkerState] = {}
        self.largest_taking: dict[str, int] = {}

    def changed(self) -> None:
        """A worker came or went, or the rows one may hold changed (capacity, memory, a refused shape)."""
        self._stale = True
        self.epoch += 1

    def current(self, workers: Mapping[str, WorkerState]) -> FleetRows:
        """Brought up to date with `workers` (at least one), each worker's `rows` with it."""
        if self._stale:
            live = list(workers.values())
            for w in live:
                w.rows = self.rows_of(w)
            self.smallest_worker = min(live, key=lambda w: w.rows)
            self.largest_worker = max(live, key=lambda w: w.rows)
            self.largest = self.largest_worker.rows
            self.refused_everywhere = frozenset.intersection(*(w.refused_labels for w in live))
            self.largest_taker = {label: max((w for w in live if label not in w.refused_labels), key=lambda w: w.rows)
                                  for label in frozenset().union(*(w.refused_labels for w in live))
                                  - self.refused_everywhere}
            self.largest_taking = {label: w.rows for label, w in self.largest_taker.items()}
            self._stale = False
        return self

    def largest_for(self, label: str) -> int:
        """The rows of the largest live worker that takes forward `label` (the largest when none does)."""
        return self.largest_taking.get(label, self.largest)

    def decide(self, spec, action_mode: str, label: str, policy: AdmissionPolicy) -> AdmissionDecision:
        """How a group of `spec` (forward `label`) runs on the fleet as `current` left it."""
        if label in self.refused_everywhere:
            error = CandidateContractError("count", "does_not_fit", f"one candidate of forward {label} ran every "
                                           "live worker out of memory", spec.count)
            return AdmissionDecision(AdmissionMode.REJECTED, (), REASON_DOES_NOT_FIT, error)
        # (the smallest holds no more than any worker that takes the shape)
        worker = self.largest_taker.get(label, self.largest_worker) if policy is AdmissionPolicy.REJECT \
            else self.smallest_worker
        return decide(spec, worker.capability, action_mode=action_mode, policy=policy, batch_capacity=worker.rows)
