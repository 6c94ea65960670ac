"""A worker's graceful way out: when it may go, and why, as a value the I/O thread asks.

On SIGTERM (a rolling update, a scale-down, a preemption notice) the worker says LEAVING. The scheduler
sends it nothing more and answers LEAVE_ACK with every assignment it has sent and not had answered --
some may still be on the way, which is why the worker cannot count what it holds itself. The worker
runs them as usual and goes (LEFT) once it has answered every one of them, or when its grace period
ends, whichever comes first: then the scheduler retries what is left elsewhere. With no answer to
LEAVING (no scheduler), a worker that holds nothing goes after `ack_timeout_s`; one that holds work
finishes it first, within the grace.

Why an acknowledgement: a result the worker sent before LEAVING reaches the scheduler before LEAVING
does (one connection, in order), so the list in LEAVE_ACK is exactly what the worker still owes.
"""

from __future__ import annotations

from collections.abc import Iterable

FINISHED, GRACE_EXPIRED, NO_ACK = "finished", "grace_expired", "no_ack"


class Departure:
    def __init__(self, grace_s: float, now: float, ack_timeout_s: float):
        self.grace_s = max(0.0, float(grace_s))
        self.asked_at = now
        self.deadline = now + self.grace_s
        self.ack_timeout_s = ack_timeout_s
        self.owed: set[int] | None = None  # None until LEAVE_ACK
        self._answered: set[int] = set()  # answered since LEAVING went out

    def acknowledged(self, batch_ids: Iterable[int]) -> None:
        """LEAVE_ACK: what the scheduler counts on (less what was answered while it was on its way)."""
        self.owed = set(batch_ids) - self._answered

    def answered(self, batch_id: int) -> None:
        self._answered.add(batch_id)
        if self.owed is not None:
            self.owed.discard(batch_id)

    def outcome(self, now: float, holding: bool) -> str | None:
        """Why the worker may go now (the LEFT message's reason), or None: not yet."""
        if self.owed is not None and not self.owed:
            return FINISHED
        if now >= self.deadline:
            return GRACE_EXPIRED
        if self.owed is None and not holding and now - self.asked_at >= self.ack_timeout_s:
            return NO_ACK
        return None
