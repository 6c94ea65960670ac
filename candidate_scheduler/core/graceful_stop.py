"""The scheduler's graceful stop: when a stopping scheduler may go.

On SIGTERM (Kubernetes replacing the pod, systemd stopping the unit) the scheduler stops admitting new
groups (they are refused `rejected` / `stopping`, which a client that resubmits takes as "send it to the
next run") and keeps serving the groups it has admitted, queued ones included, for up to `grace_s`. It
goes as soon as none is left, when the grace runs out, or when no worker is left to serve them (the
fleet stopped with it: waiting would only delay the next run); the shutdown then answers what is left
`shutting_down`, as an immediate stop answers everything. Without this every upgrade of the scheduler
threw away the work in flight, and clients ran it again from the start on the next run.

A decision, not an action: the shell (service/server.py) asks `verdict` on each pass of its loop and
carries it out.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable

from candidate_scheduler.core.values import value


class Verdict(enum.Enum):
    SERVE = "serve"  # groups are in flight and the grace has not run out: keep serving them
    FINISHED = "finished"  # every admitted group has been answered: go now
    GRACE_EXPIRED = "grace_expired"  # go now; what is left is answered `shutting_down`
    NO_WORKERS = "no_workers"  # go now: no worker, live or leaving, is left to serve what is in flight


@value
class GracefulStop:
    began: float  # when the stop was asked (the shell's monotonic clock)
    grace_s: float

    @property
    def until(self) -> float:
        return self.began + self.grace_s

    def verdict(self, now: float, in_flight: int, workers: int) -> Verdict:
        """`workers`: live and leaving ones (a silent one counts until its heartbeats lapse)."""
        if in_flight == 0:
            return Verdict.FINISHED
        if now >= self.until:
            return Verdict.GRACE_EXPIRED
        if workers == 0:
            return Verdict.NO_WORKERS
        return Verdict.SERVE


def serving_workers(live: Collection, leaving: Iterable) -> int:
    """The workers that can still answer groups in flight: every live one, and each leaving one that holds
    work. A leaving worker takes no new work, so one that holds nothing serves nobody, however long it
    takes to say LEFT (one that never does kept a stop with a queue and no live worker for its grace)."""
    return len(live) + sum(1 for w in leaving if w.assignments)
