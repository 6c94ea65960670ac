"""Fair queueing across tenants for groups without a deadline: how far back a group is put.

Start-time fair queueing (Goyal, Vin and Cheng, SIGCOMM 1996) gives each best-effort group a start tag
in work units (candidates x steps x observations): the later of the system's virtual time -- the tag of
the last such group a worker took -- and the finish tag of its tenant's previous group. The tag minus
the virtual time is the tenant's *lead*: the work it already has waiting ahead of this group. A tenant
that floods the queue stamps its own groups with ever larger leads; another tenant's group has none.

The lead is converted to seconds (`UNIT_S` per work unit) and added to the group's receipt time: its
place in the queue is `receipt + lead + best-effort slack` (core/deadlines.effective_deadline). So a
newcomer goes in just behind what a flooding tenant already had started, the flood's later groups
fall back by their own backlog, and the comparison with deadlines stays in real time -- the key is a
receipt time plus a bounded offset, never a virtual clock that could drift from the wall clock.
`UNIT_S` errs long on purpose: too long only makes a flood's later groups yield more to deadline
traffic (their own backlog), too short would leave part of a flood ahead of a newcomer.

With nothing waiting the virtual time and the tenants' finish tags reset: an idle queue owes nobody
anything.
"""

from __future__ import annotations

# Seconds a work unit (one candidate for one denoise step) stands for: a fleet-wide rate well below
# what one GPU worker does (~1-5 ms per candidate-step), so a flood's lead is not under-counted.
UNIT_S = 0.01


class FairClock:
    def __init__(self, fair: bool = True):
        self.fair = fair  # False: no lead; the order is receipt time across tenants (first come, first served)
        self.virtual = 0.0
        self.finish: dict[str, float] = {}
        self.queued = 0  # stamped groups not yet taken by a worker nor ended

    def stamp(self, tenant: str, work: float, weight: float) -> tuple[float, float]:
        """(start tag, lead in seconds) of a new best-effort group of `tenant` costing `work` units."""
        if self.queued == 0:
            self.virtual = 0.0
            self.finish.clear()
        self.queued += 1
        if not self.fair:
            return 0.0, 0.0
        start = max(self.virtual, self.finish.get(tenant, self.virtual))
        self.finish[tenant] = start + work / weight
        return start, (start - self.virtual) * UNIT_S

    def left(self, tag: float, started: bool) -> None:
        """A stamped group was taken by a worker (`started`) or ended before any was: once per group."""
        if self.queued <= 0:
            raise RuntimeError("FairClock.left without a stamped group waiting")
        self.queued -= 1
        if started and self.fair:
            self.virtual = max(self.virtual, tag)
