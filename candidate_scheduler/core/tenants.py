"""Tenants: who owns each group, per-tenant limits on groups in flight, and fair queueing among them.

Fair queueing is start-time fair queueing (Goyal, Vin and Cheng, SIGCOMM 1996) over the groups without
a deadline. Each gets a start tag when admitted: the later of the system's virtual time and the finish
tag of its tenant's previous group; its finish tag is the start plus its work (candidates x steps x
observations, in `WORK_UNIT_S` units) divided by the tenant's weight. Virtual time is the start tag of
the last such group a worker took. A tenant that floods the queue stamps its own groups ever further
ahead; another tenant's group, stamped at the virtual time, goes in just behind the group a worker took
last -- it waits about a batch, not the backlog. The clock is self-timed (what started, not the wall
clock), so an estimate of a group's cost that is off only scales the tags; with nothing waiting it is
set back to now, which keeps the tags near real time.

The start tag replaces the receipt time in the effective deadline of a best-effort group (tag +
best-effort slack: core/deadlines.effective_deadline). Groups with deadlines keep earliest-deadline
first among themselves and against the best-effort ones; a best-effort group's tag is fixed once
stamped, so deadlines arriving later eventually fall behind it: it is never starved.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from candidate_scheduler.core.access import DEFAULT_TENANT, Principal, check_name

WORK_UNIT_S = 1e-3  # virtual seconds per candidate-step: a unit of the tags, not a forecast
_OWNERS_REMEMBERED = 10_000  # finished groups whose owners STATUS and CANCEL still check


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's limit on groups in flight (None: only the scheduler's) and its share's weight."""

    name: str
    max_in_flight: int | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_name("tenant", self.name)
        if self.max_in_flight is not None and (not isinstance(self.max_in_flight, int) or self.max_in_flight < 1):
            raise ValueError(f"tenant {self.name}: max_in_flight must be a positive int, got {self.max_in_flight!r}")
        if not self.weight > 0:
            raise ValueError(f"tenant {self.name}: weight must be > 0, got {self.weight!r}")


class FairClock:
    """Start-time fair queueing tags for best-effort groups (see the module docstring)."""

    def __init__(self, fair: bool = True):
        self.fair = fair  # False: the tag is the receipt time (first come, first served across tenants)
        self.virtual = 0.0
        self.finish: dict[str, float] = {}
        self.queued = 0  # stamped groups not yet taken by a worker nor ended

    def stamp(self, tenant: str, work: float, weight: float, now: float) -> float:
        if self.queued == 0:
            self.virtual = now
            self.finish.clear()  # an idle queue owes nobody anything
        self.queued += 1
        if not self.fair:
            return now
        start = max(self.virtual, self.finish.get(tenant, self.virtual))
        self.finish[tenant] = start + work * WORK_UNIT_S / weight
        return start

    def left(self, tag: float, started: bool) -> None:
        """A stamped group was taken by a worker (`started`) or ended before any was."""
        self.queued = max(0, self.queued - 1)
        if started and self.fair:
            self.virtual = max(self.virtual, tag)


class Tenants:
    def __init__(self, policies: tuple[TenantPolicy, ...] = (), *, fair: bool = True):
        self.policies = {p.name: p for p in policies}
        self.in_flight: collections.Counter[str] = collections.Counter()
        self.owners: dict[str, tuple[str, ...]] = {}  # request id -> principals it belongs to, in flight
        self.finished_owners: collections.OrderedDict[str, tuple[str, ...]] = collections.OrderedDict()
        self.clock = FairClock(fair)

    def policy(self, tenant: str) -> TenantPolicy:
        return self.policies.get(tenant) or TenantPolicy(tenant)

    def over_limit(self, principal: Principal) -> str | None:
        """Why a group of this principal's tenant is refused `overloaded` now (None: it is not)."""
        limit = self.policy(principal.tenant).max_in_flight
        n = self.in_flight[principal.tenant]
        if limit is not None and n >= limit:
            return f"tenant {principal.tenant!r} has {n} groups in flight (its limit is {limit}); try again later"
        return None

    def kept(self, request_id: str, tenant: str, owners: tuple[str, ...]) -> None:
        self.in_flight[tenant] += 1
        self.owners[request_id] = owners

    def forgot(self, request_id: str, tenant: str) -> None:
        owners = self.owners.pop(request_id, None)
        if owners is None:
            return
        self.in_flight[tenant] -= 1
        if self.in_flight[tenant] <= 0:
            del self.in_flight[tenant]
        self.finished_owners[request_id] = owners
        while len(self.finished_owners) > _OWNERS_REMEMBERED:
            self.finished_owners.popitem(last=False)

    def owners_of(self, request_id: str) -> tuple[str, ...] | None:
        owners = self.owners.get(request_id)
        return owners if owners is not None else self.finished_owners.get(request_id)

    def stamp(self, tenant: str, work: float, now: float) -> float:
        return self.clock.stamp(tenant, work, self.policy(tenant).weight, now)

    def names(self) -> list[str]:
        """The tenants configured or in flight (bounded: the key directory names them)."""
        return sorted({*self.policies, *self.in_flight, DEFAULT_TENANT})
