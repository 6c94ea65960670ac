"""Rights (core/access.py) as a table, and the engine applying them: own groups, admin-only actions,
per-tenant limits (core/tenants.py). Fair queueing: tests/unit/test_fair_queue.py."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.access import (
    FORBIDDEN,
    LOCAL,
    Action,
    Principal,
    Role,
    acting_for,
    denied,
)
from candidate_scheduler.core.tenants import TenantPolicy
from tests.unit.test_engine import Harness, submission

ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "rl", Role.CLIENT)
ADMIN = Principal("ops", "default", Role.ADMIN)
FRONT = Principal("openpi-front", "default", Role.PROXY)
WORKER = Principal("gpu-1", "default", Role.WORKER)


@pytest.mark.parametrize("who, action, owners, allowed", [
    (ALICE, Action.SUBMIT, None, True),
    (ALICE, Action.CANCEL, ("alice",), True),
    (ALICE, Action.CANCEL, ("bob",), False),
    (ALICE, Action.STATUS, ("bob",), False),
    (ALICE, Action.STATUS, None, True),  # an id nobody here owns reveals nothing
    (ALICE, Action.STATS, None, False),
    (ALICE, Action.DRAIN, None, False),
    (ALICE, Action.SHUTDOWN, None, False),
    (ALICE, Action.COMPAT_REPORT, None, False),
    (FRONT, Action.COMPAT_REPORT, None, True),
    (FRONT, Action.STATS, None, True),
    (FRONT, Action.CANCEL, ("alice", "openpi-front"), True),  # a group it sent for alice
    (FRONT, Action.SHUTDOWN, None, False),
    (ALICE, Action.WORKER_LEAVE, None, False),
    (FRONT, Action.WORKER_LEAVE, None, False),
    (ADMIN, Action.WORKER_LEAVE, None, True),
    (ADMIN, Action.CANCEL, ("bob",), True),
    (ADMIN, Action.SHUTDOWN, None, True),
    (LOCAL, Action.STATS, None, True),
    (WORKER, Action.SUBMIT, None, False),
])
def test_the_rights_table(who, action, owners, allowed):
    why = denied(who, action, owners)
    assert (why is None) is allowed, why


def test_names_are_bounded_and_safe():
    for bad in ("", "a b", "../x", "x" * 65, "-lead", "é"):
        with pytest.raises(ValueError, match="name"):
            Principal(bad)
        with pytest.raises(ValueError, match="name"):
            Principal("ok", tenant=bad)
    assert Principal("robot-7.a_b").role is Role.CLIENT


def test_only_a_proxy_or_an_admin_acts_for_another():
    directory = {"alice": ALICE, "gpu-1": WORKER, "ops": ADMIN, "other-front": FRONT}.get
    assert acting_for(FRONT, "alice", directory) == (ALICE, None)
    assert acting_for(FRONT, None, directory) == (FRONT, None)
    assert acting_for(BOB, "bob", directory) == (BOB, None)
    _, why = acting_for(BOB, "alice", directory)
    assert "may not submit on behalf" in why
    for name in ("nobody", "gpu-1", "ops", "other-front"):  # only a client may be acted for
        _, why = acting_for(FRONT, name, directory)
        assert "no client named" in why


def test_a_client_cancels_and_queries_only_its_own_groups():
    h = Harness()
    h.register("w1")
    h.take(h.engine.submit(("c", "a"), submission("a", count=2), h.now, principal=ALICE))
    no, out = h.engine.cancel("a", h.now, BOB)
    assert (no.ok, no.error_code, out) == (False, FORBIDDEN, [])
    assert h.engine.status("a", BOB).error_code == FORBIDDEN
    assert h.engine.status("a", ALICE).state in ("admitted", "running")
    h.run_all()
    assert h.reply("a").status == "done"
    # after it ended, its owner is remembered: still not bob's to ask about
    assert h.engine.status("a", BOB).error_code == FORBIDDEN
    assert h.engine.status("a", ADMIN).state == "done"
    yes, _ = h.engine.cancel("a", h.now, ALICE)
    assert yes.ok and not yes.changed
    h.take(h.engine.submit(("c", "b"), submission("b", count=2), h.now, principal=ALICE))
    yes, out = h.engine.cancel("b", h.now, ADMIN)
    h.take(out)
    assert yes.changed and h.reply("b").status == "cancelled"


def test_a_proxys_group_belongs_to_the_client_it_acted_for_and_to_the_proxy():
    h = Harness()
    h.register("w1")
    h.take(h.engine.submit(("c", "p"), submission("p"), h.now, principal=ALICE, via=FRONT.name))
    assert h.engine.status("p", FRONT).ok and h.engine.status("p", ALICE).ok
    assert h.engine.status("p", BOB).error_code == FORBIDDEN
    assert h.engine.tenants.in_flight["robots"] == 1


def test_a_tenant_at_its_limit_is_told_so_and_others_are_not():
    h = Harness(tenants=(TenantPolicy("rl", max_in_flight=2),))
    for i in range(3):
        h.take(h.engine.submit(("c", f"r{i}"), submission(f"r{i}"), h.now, principal=BOB))
    h.take(h.engine.submit(("c", "a0"), submission("a0"), h.now, principal=ALICE))
    r = h.reply("r2")
    assert (r.status, r.error_code) == ("overloaded", "tenant_overloaded")
    assert "'rl'" in r.error and "limit is 2" in r.error
    assert "a0" not in h.replies  # alice's tenant has no limit of its own
    h.register("w1")
    h.run_all()
    assert h.reply("r0").status == "done" and h.reply("a0").status == "done"
    assert not h.engine.tenants.in_flight  # every count given back
    h.take(h.engine.submit(("c", "r3"), submission("r3"), h.now, principal=BOB))
    h.run_all()
    assert h.reply("r3").status == "done"


def test_every_control_message_but_ping_names_the_right_it_needs():
    from candidate_scheduler import protocol
    from candidate_scheduler.service.server import CONTROL_ACTIONS

    assert set(CONTROL_ACTIONS) == protocol.CONTROL_KINDS - {protocol.Kind.PING}
