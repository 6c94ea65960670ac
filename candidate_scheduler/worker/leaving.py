"""A worker's graceful way out: when it may go, and why, as a value the I/O thread asks.

On SIGTERM (a rolling update, a scale-down, a preemption notice), or when an operator asks the
scheduler, the worker says LEAVING. The scheduler sends it nothing more and answers LEAVE_ACK with every
assignment it has sent and not had answered. The worker runs the ones it has admitted as usual, gives
back those still waiting for its rows (GIVE_BACK, when the ack says the scheduler takes it: they run
elsewhere at once), and goes (LEFT) once it has answered every one of them, or when its grace period
ends, whichever comes first: then the scheduler retries what is left elsewhere.

Why an acknowledgement, and why only what the worker holds: what the scheduler sent before LEAVE_ACK
reaches the worker before it does (one connection, in order), and a result the worker sent before
LEAVING reaches the scheduler before LEAVING. So when the ack is read, an id in it that the worker
does not hold was either answered already or lost on the link (a reconnect): waiting for it would only
wait out the grace, and the scheduler retries a lost one anyway when the worker's heartbeats or LEFT
leave it out.

Unanswered, LEAVING is asked again every `ack_timeout_s` (it may have been lost; a scheduler of an
earlier release drops it). With no answer, a worker that holds nothing goes after `ack_timeout_s`; one
that holds work keeps at it until its grace ends, since a scheduler that does not answer LEAVING may
still read its results.
"""

from __future__ import annotations

from collections.abc import Iterable

FINISHED, GRACE_EXPIRED, NO_ACK = "finished", "grace_expired", "no_ack"


class Departure:
    def __init__(self, grace_s: float, now: float, ack_timeout_s: float):
        self.grace_s = max(0.0, float(grace_s))
        self.deadline = now + self.grace_s
        self.ack_timeout_s = ack_timeout_s
        self.asked_at = now  # LEAVING went out (last)
        self.owed: set[int] | None = None  # None until LEAVE_ACK
        self.lost_on_link = 0  # ids in the ack the worker neither holds nor has answered
        self._answered: set[int] = set()  # since LEAVING went out: the ack may list them, and they are not lost

    def acknowledged(self, batch_ids: Iterable[int], held: Iterable[int]) -> None:
        """LEAVE_ACK: what the scheduler counts on, of what the worker holds (see the module docstring)."""
        listed, held = set(batch_ids), set(held)
        self.owed = listed & held
        self.lost_on_link = len(listed - held - self._answered)

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

    def ask_again(self, now: float) -> bool:
        """Whether to send LEAVING once more now (asked after `outcome`)."""
        if self.owed is not None or now - self.asked_at < self.ack_timeout_s:
            return False
        self.asked_at = now
        return True
