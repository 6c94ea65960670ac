"""A client across a restart of its scheduler: which answers mean "not run, send it to the next run",
and when the run that answers is the next one (service/client.py's `resubmit`)."""

from __future__ import annotations

# what a stopping scheduler answers groups it will not run: in flight at its stop (`shutting_down`), or
# sent while it stops (`stopping`); run by no one, so `submit(resubmit=True)` sends them to its next run.
# Not `draining`: an operator's drain says nothing of a next run.
NOT_RUN_BY_A_STOPPING_SCHEDULER = frozenset({("failed", "shutting_down"), ("rejected", "stopping")})


class NextRun:
    """When the run that answers is another than the stopping one: its PONG says another incarnation, or,
    from a scheduler that says none, a PONG after one went unanswered. Probes start short (a PING sent to
    the stopping run as it exits is lost) and double while unanswered, up to `liveness_s`."""

    def __init__(self, stopping: str | None, liveness_s: float | None, *, gone: bool = False):
        self.stopping = stopping
        self.longest_s = max(liveness_s or 1.0, 0.25)
        self.probe_s = 0.25
        self.gone = gone  # True: it stopped answering already (SchedulerUnavailable); any PONG is a run back

    def unanswered(self) -> None:
        self.gone = True
        self.probe_s = min(2 * self.probe_s, self.longest_s)

    def answered_by(self, incarnation: str | None) -> bool:
        return (bool(incarnation) and incarnation != self.stopping) or (self.gone and not incarnation)
