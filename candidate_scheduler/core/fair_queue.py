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
anything. A group that leaves before any worker took it (cancelled, failed, shut down) gives its work
back to its tenant's finish tag: it no longer waits ahead of the tenant's next group.
"""

from __future__ import annotations

# Seconds a work unit (one candidate for one denoise step) stands for: a fleet-wide rate well below
# what one GPU worker does (~1-5 ms per candidate-step), so a flood's lead is not under-counted.
UNIT_S = 0.01


class Tag(float):
    """A start tag that remembers whose group it stamped and what that group added to its tenant's finish
    tag: the engine hands back only the tag when the group leaves (`FairClock.left`), and ties between
    tenants are common (every newcomer starts at the virtual time), so the tag itself must say."""

    __slots__ = ("tenant", "cost")

    def __new__(cls, start: float, tenant: str, cost: float) -> Tag:
        tag = super().__new__(cls, start)
        tag.tenant, tag.cost = tenant, cost
        return tag

    def __reduce__(self):  # copies and pickles keep what it remembers (float's own would drop it)
        return Tag, (float(self), self.tenant, self.cost)


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
        return Tag(start, tenant, work / weight), (start - self.virtual) * UNIT_S

    def left(self, tag: float, started: bool) -> None:
        """A stamped group was taken by a worker (`started`) or ended before any was: once per group."""
        if self.queued <= 0:
            raise RuntimeError("FairClock.left without a stamped group waiting")
        self.queued -= 1
        if started and self.fair:
            self.virtual = max(self.virtual, float(tag))
        elif not started and isinstance(tag, Tag) and tag.tenant in self.finish:
            # its work no longer waits: the tenant's next group need not go behind it (groups of the tenant
            # queued after it keep their places; only the backlog a newcomer of the tenant counts shrinks)
            self.finish[tag.tenant] -= tag.cost
