"""Tenants: who owns each group, per-tenant limits on groups in flight, and their fair shares.

A principal (core/access.py) names its tenant. `Tenants` counts each tenant's groups in flight against
its limit (`TenantPolicy.max_in_flight`), remembers which principals each group belongs to (the rights
on cancel and status), and holds the fair-queueing clock (core/fair_queue.py) whose leads order
best-effort groups across tenants.
"""

from __future__ import annotations

import collections
import math

from candidate_scheduler.core.access import Principal, check_name
from candidate_scheduler.core.fair_queue import FairClock
from candidate_scheduler.core.values import value

# A weight divides a group's work into its tenant's fair-queue tag: past these bounds a tag overflows to
# inf (a tiny weight) and the next lead is inf - inf = nan, or a tenant escapes fair queueing (weight inf)
MIN_WEIGHT, MAX_WEIGHT = 1e-3, 1e3


@value
class TenantPolicy:
    """A tenant's limit on groups in flight (None: only the scheduler's) and its share's weight."""

    name: str
    max_in_flight: int | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_name("tenant", self.name)
        if self.max_in_flight is not None and (isinstance(self.max_in_flight, bool)
                                               or not isinstance(self.max_in_flight, int) or self.max_in_flight < 1):
            raise ValueError(f"tenant {self.name}: max_in_flight must be a positive int, got {self.max_in_flight!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) \
                or not (math.isfinite(self.weight) and MIN_WEIGHT <= self.weight <= MAX_WEIGHT):
            raise ValueError(f"tenant {self.name}: weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, "
                             f"got {self.weight!r}")


class Tenants:
    def __init__(self, policies: tuple[TenantPolicy, ...] = (), *, fair: bool = True, remember: int = 10_000):
        self.policies = {p.name: p for p in policies}
        self.in_flight: collections.Counter[str] = collections.Counter()
        self.owners: dict[str, tuple[str, ...]] = {}  # request id -> principals it belongs to, in flight
        self.finished_owners: collections.OrderedDict[str, tuple[str, ...]] = collections.OrderedDict()
        self.clock = FairClock(fair)
        self.remember = remember  # ended groups whose owners STATUS and CANCEL still check

    def policy(self, tenant: str) -> TenantPolicy:
        policy = self.policies.get(tenant)
        if policy is None:  # the default, kept: this is asked twice for every group
            policy = self.policies[tenant] = TenantPolicy(tenant)
        return policy

    def over_limit(self, principal: Principal) -> str | None:
        """Why a group of this principal's tenant is refused `overloaded` now (None: it is not)."""
        limit = self.policy(principal.tenant).max_in_flight
        n = self.in_flight[principal.tenant]
        if limit is not None and n >= limit:
            return f"tenant {principal.tenant!r} has {n} groups in flight (its limit is {limit}); try again later"
        return None

    def over_capacity(self, tenant: str, in_flight: int, capacity: int) -> bool:
        """Whether the scheduler's limit on groups in flight refuses a group of `tenant` now. The limit
        is soft for a tenant below its share of it (capacity / tenants in flight, itself included), so
        one tenant's flood cannot shut the others out; the hard limit is twice the capacity."""
        if in_flight < capacity:
            return False
        if in_flight >= 2 * capacity:
            return True
        tenants = len(self.in_flight) + (tenant not in self.in_flight)
        # n >= capacity / tenants, exactly: rounded down, a share below one group was zero, and a tenant with
        # nothing in flight was refused beside another's flood whenever more tenants than the limit had groups
        return self.in_flight[tenant] * tenants >= capacity

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
        # a reused id is the newest again, as Engine.finished keeps it: else its owners went first while its
        # state stayed, and that state answered anyone's STATUS
        self.finished_owners.move_to_end(request_id)
        while len(self.finished_owners) > self.remember:
            self.finished_owners.popitem(last=False)

    def owners_of(self, request_id: str) -> tuple[str, ...] | None:
        owners = self.owners.get(request_id)
        return owners if owners is not None else self.finished_owners.get(request_id)

    def stamp(self, tenant: str, work: float) -> tuple[float, float]:
        """(start tag, lead in seconds) of a best-effort group of `tenant` (core/fair_queue.py)."""
        return self.clock.stamp(tenant, work, self.policy(tenant).weight)
