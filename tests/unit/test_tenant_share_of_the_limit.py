"""The scheduler's limit on groups in flight is soft for a tenant below its share of it (core/tenants.py,
`Tenants.over_capacity`): capacity / tenants in flight, itself included. A share is a real number: with
more tenants than the limit has groups, each tenant's share is below one, and a tenant with nothing in
flight is still below it -- it must not be shut out while another tenant's flood holds more than its own."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.access import Principal, Role
from candidate_scheduler.core.tenants import TenantPolicy, Tenants
from tests.unit.test_engine import Harness, submission


def _who(tenant: str) -> Principal:
    return Principal(tenant, tenant, Role.CLIENT)


def _send(h: Harness, rid: str, tenant: str) -> None:
    h.take(h.engine.submit(("c", rid), submission(rid), h.now, principal=_who(tenant)))


def test_a_tenant_with_nothing_in_flight_is_not_shut_out_by_another_tenants_flood():
    # a limit of 3 groups; bob fills it, alice and carol each get one group in beside his flood
    h = Harness(max_queued_groups=3)
    for i in range(3):
        _send(h, f"b{i}", "bob")
    _send(h, "b3", "bob")
    assert h.reply("b3").status == "overloaded"  # bob is at the whole limit: over his share
    _send(h, "a0", "alice")
    _send(h, "c0", "carol")
    assert "a0" not in h.replies and "c0" not in h.replies
    # dave has nothing in flight: his share of 3 among 4 tenants is 0.75 groups, and 0 is below it
    # (5 groups in flight, under the hard limit of 6)
    _send(h, "d0", "dave")
    assert "d0" not in h.replies, h.replies.get("d0")
    # bob, at 3 groups, is far over his share; so is alice at her one, now that four tenants share 3
    _send(h, "b4", "bob")
    _send(h, "a1", "alice")
    assert h.reply("b4").status == "overloaded" and h.reply("a1").status == "overloaded"
    h.register("w1")
    h.run_all()
    assert all(h.reply(rid).status == "done" for rid in ("b0", "b1", "b2", "a0", "c0", "d0"))


def test_the_share_is_compared_exactly_not_rounded_down():
    t = Tenants()
    for i in range(10):
        t.kept(f"b{i}", "bob", ("bob",))
    for i in range(3):
        t.kept(f"a{i}", "alice", ("alice",))
    t.kept("c0", "carol", ("carol",))
    # 14 in flight over a limit of 10, three tenants: a share is 10 / 3 = 3.33 groups
    assert not t.over_capacity("alice", 14, 10)  # 3 groups: below it
    assert not t.over_capacity("carol", 14, 10)  # 1 group: below it
    t.kept("a3", "alice", ("alice",))
    assert t.over_capacity("alice", 15, 10)  # 4 groups: over it
    assert t.over_capacity("bob", 15, 10)
    assert t.over_capacity("dave", 20, 10)  # the hard limit, twice the capacity, holds for everyone


def test_a_tenants_limit_must_be_a_true_int_not_a_bool():
    # True is an int to isinstance: it was taken as a limit of one group (and reported as `true` in stats)
    for bad in (True, False, 0, 1.0, "2"):
        with pytest.raises(ValueError, match="max_in_flight"):
            TenantPolicy("rl", max_in_flight=bad)
    assert TenantPolicy("rl", max_in_flight=1).max_in_flight == 1
