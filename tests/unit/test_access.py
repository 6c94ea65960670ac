"""Rights (core/access.py) as a table, and the engine applying them: own groups, admin-only actions,
per-tenant limits and fair queueing across tenants (core/tenants.py)."""

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
from candidate_scheduler.core.tenants import FairClock, TenantPolicy
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
    directory = {"alice": ALICE, "gpu-1": WORKER}.get
    assert acting_for(FRONT, "alice", directory) == (ALICE, None)
    assert acting_for(FRONT, None, directory) == (FRONT, None)
    assert acting_for(BOB, "bob", directory) == (BOB, None)
    _, why = acting_for(BOB, "alice", directory)
    assert "may not submit on behalf" in why
    for name in ("nobody", "gpu-1"):
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


def _first_batch_of(h: Harness, rid: str) -> int:
    return next(i for i, w in enumerate(h.work) if any(s.dispatch.request_id == rid for s in w.slices))


@pytest.mark.parametrize("fair", [True, False])
def test_a_flooding_tenant_holds_another_back_by_about_a_batch_only_when_fair(fair):
    # one worker of 8 rows; bob floods 200 one-candidate groups, then alice sends one
    h = Harness(fair_queueing=fair)
    h.register("w1")
    for i in range(200):
        h.take(h.engine.submit(("c", f"b{i}"), submission(f"b{i}", steps=4 + i % 2), h.now, principal=BOB))
    h.answer(h.work[-1])  # a batch of bob's ran meanwhile
    h.take(h.engine.submit(("c", "alice"), submission("alice", steps=4), h.now, principal=ALICE))
    h.run_all()
    batches_before = _first_batch_of(h, "alice")
    if fair:
        assert batches_before <= 3, batches_before  # the one running, at most one more, then hers
    else:
        assert batches_before > 20, batches_before  # first come, first served: behind the whole flood
    assert all(h.reply(f"b{i}").status == "done" for i in range(200))


def test_deadlines_keep_earliest_first_and_best_effort_is_not_starved():
    h = Harness()
    h.register("w1", capacity=1, max_batch=1)
    h.take(h.engine.submit(("c", "be"), submission("be"), h.now, principal=BOB))  # runs at once
    h.take(h.engine.submit(("c", "be2"), submission("be2"), h.now, principal=BOB))
    for i in range(3):  # due before be2's best-effort slack runs out: they go first, earliest first
        h.take(h.engine.submit(("c", f"d{i}"), submission(f"d{i}", deadline_s=20.0 - i), h.now, principal=ALICE))
    h.run_all()
    order = [w.slices[0].dispatch.request_id for w in h.work]
    assert order == ["be", "d2", "d1", "d0", "be2"]
    # a deadline later than the slack: the best-effort group that waits is not passed by it
    h.take(h.engine.submit(("c", "be3"), submission("be3"), h.now, principal=BOB))
    h.take(h.engine.submit(("c", "be4"), submission("be4"), h.now, principal=BOB))
    h.take(h.engine.submit(("c", "late"), submission("late", deadline_s=60.0), h.now, principal=ALICE))
    h.run_all()
    assert [w.slices[0].dispatch.request_id for w in h.work][5:] == ["be3", "be4", "late"]


def test_the_fair_clock_stamps_a_newcomer_at_the_virtual_time_and_resets_when_idle():
    c = FairClock()
    tags = [c.stamp("a", 8, 1.0, now=10.0) for _ in range(5)]
    assert tags == pytest.approx([10.0, 10.008, 10.016, 10.024, 10.032])
    c.left(tags[0], started=True)
    c.left(tags[1], started=True)
    assert c.stamp("b", 8, 1.0, now=11.0) == pytest.approx(10.008)  # behind what started, ahead of a's rest
    assert c.stamp("b", 8, 2.0, now=11.0) == pytest.approx(10.016)
    for t in tags[2:]:
        c.left(t, started=False)
    c.left(10.008, started=True)
    c.left(10.016, started=False)
    assert c.queued == 0
    assert c.stamp("a", 8, 1.0, now=50.0) == 50.0  # an idle queue owes nobody anything
