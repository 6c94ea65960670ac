"""Fair queueing across tenants (core/fair_queue.py) in the engine: a flood holds another tenant back by
about a batch; deadlines keep earliest-first and a best-effort group ages past them; the order stays in
real time under a long flood on a slow fleet (no drift); one tenant cannot fill the scheduler's limit
for everyone; and every stamped group is accounted for on every way out."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.access import Principal, Role
from candidate_scheduler.core.fair_queue import UNIT_S, FairClock
from tests.unit.test_engine import Harness, submission

ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "rl", Role.CLIENT)


def _send(h: Harness, rid: str, who: Principal, **kw) -> None:
    h.take(h.engine.submit(("c", rid), submission(rid, **kw), h.now, principal=who))


def _first_batch_of(h: Harness, rid: str) -> int:
    return next(i for i, w in enumerate(h.work) if any(s.dispatch.request_id == rid for s in w.slices))


def _started(h: Harness) -> list[str]:
    return [s.dispatch.request_id for w in h.work for s in w.slices]


def test_the_clock_gives_a_flood_growing_leads_a_newcomer_none_and_forgets_when_idle():
    c = FairClock()
    stamps = [c.stamp("a", 8, 1.0) for _ in range(5)]
    assert [lead for _tag, lead in stamps] == pytest.approx([0.0, 8 * UNIT_S, 16 * UNIT_S, 24 * UNIT_S, 32 * UNIT_S])
    c.left(stamps[0][0], started=True)
    c.left(stamps[1][0], started=True)
    tag, lead = c.stamp("b", 8, 1.0)
    assert (tag, lead) == (8.0, 0.0)  # just behind what started, ahead of the rest of a's flood
    weighted = FairClock()
    weighted.stamp("w", 8, 2.0)
    assert weighted.stamp("w", 8, 2.0) == (4.0, pytest.approx(4 * UNIT_S))  # weight 2: half the lead
    c.stamp("b", 8, 1.0)
    for t, _ in stamps[2:]:
        c.left(t, started=False)
    c.left(8.0, started=True)
    c.left(16.0, started=False)
    assert c.queued == 0
    assert c.stamp("a", 8, 1.0) == (0.0, 0.0)  # an idle queue owes nobody anything
    with pytest.raises(RuntimeError):
        FairClock().left(0.0, started=True)
    assert FairClock(fair=False).stamp("a", 8, 1.0) == (0.0, 0.0)


@pytest.mark.parametrize("fair", [True, False])
def test_a_flooding_tenant_holds_another_back_by_about_a_batch_only_when_fair(fair):
    # one worker of 8 rows; bob floods 200 one-candidate groups, then alice sends one
    h = Harness(fair_queueing=fair)
    h.register("w1")
    for i in range(200):
        _send(h, f"b{i}", BOB, steps=4 + i % 2)
    h.answer(h.work[-1])  # a batch of bob's ran meanwhile
    _send(h, "alice", ALICE, steps=4)
    h.run_all()
    batches_before = _first_batch_of(h, "alice")
    if fair:
        assert batches_before <= 2, batches_before  # the one running, then hers
    else:
        assert batches_before > 20, batches_before  # first come, first served: behind the whole flood
    assert all(h.reply(f"b{i}").status == "done" for i in range(200))


def test_deadlines_go_earliest_first_and_a_best_effort_group_ages_past_them():
    # one worker of one row; slack 30 s: a deadline due within 30 s of the best-effort group's receipt
    # goes first, a later one does not -- however many keep coming
    h = Harness()
    h.register("w1", capacity=1, max_batch=1)
    _send(h, "running", BOB)
    _send(h, "be", BOB)
    t0 = h.now
    for i in range(6):
        _send(h, f"d{i}", ALICE, deadline_s=20.0)
        h.answer(h.work[-1])
        h.advance(5.0)
    # d0 and d1 are due before be's receipt + slack (t0 + 30); d2 (due t0 + 30) ties, and be came first
    assert _started(h)[:5] == ["running", "d0", "d1", "be", "d2"]
    assert t0 + 30.0 == t0 + 10.0 + 20.0


def test_a_deadline_is_not_held_back_by_a_long_flood_on_a_slow_fleet():
    # the order stays in real time: after 10 s of a slow flood, an 8 s deadline still goes next
    h = Harness()
    h.register("w1", capacity=8)
    for i in range(400):
        _send(h, f"b{i}", BOB)
    for _ in range(20):  # 20 batches of half a second
        h.answer(h.work[-1])
        h.advance(0.5)
    _send(h, "urgent", ALICE, deadline_s=8.0)
    h.answer(h.work[-1])
    assert _started(h).index("urgent") >= len(_started(h)) - 8  # in the batch right after it came


def test_one_tenant_cannot_fill_the_schedulers_limit_for_everyone():
    h = Harness(max_queued_groups=10)
    for i in range(10):
        _send(h, f"b{i}", BOB)
    _send(h, "b10", BOB)
    assert h.reply("b10").status == "overloaded"
    for i in range(5):  # alice's share of the 10 is 5: admitted beyond the limit
        _send(h, f"a{i}", ALICE)
    _send(h, "a5", ALICE)
    assert [h.replies.get(f"a{i}") for i in range(5)] == [None] * 5
    assert h.reply("a5").status == "overloaded"
    h.register("w1")
    h.run_all()
    assert all(h.reply(f"a{i}").status == "done" for i in range(5))


def _accounted(h: Harness) -> None:
    assert h.engine.tenants.clock.queued == 0
    assert not h.engine.tenants.in_flight and not h.engine.tenants.owners
    assert not h.engine.groups


def test_every_stamped_group_is_accounted_for_on_every_way_out():
    h = Harness(retry_limit=1, heartbeat_timeout_s=1000.0)  # the worker stays alive across the 10 s below
    h.register("w1", capacity=2, max_batch=2)
    _send(h, "done", BOB)  # runs first
    _send(h, "queued-cancel", BOB)
    _send(h, "expires", ALICE, count=2, deadline_s=5.0)
    _send(h, "fails", BOB)
    h.take(h.engine.cancel("queued-cancel", h.now, BOB)[1])
    h.advance(10.0)
    h.take(h.engine.tick(h.now))  # "expires" expires while queued
    while pending := [w for w in h.work if w.batch_id in h.engine.assignments]:
        for w in pending:
            failing = any(s.dispatch.request_id == "fails" for s in w.slices)
            h.answer(w, status="error" if failing else "ok", error_code="boom" if failing else None)
    assert {rid: h.reply(rid).status for rid in ("done", "queued-cancel", "expires", "fails")} == {
        "done": "done", "queued-cancel": "cancelled", "expires": "expired", "fails": "failed"}
    _accounted(h)
    # waiting for a worker, then admitted; then a shutdown with groups queued and running
    h2 = Harness()
    _send(h2, "w", BOB)
    h2.register("w1")
    _send(h2, "q", ALICE)
    _send(h2, "q2", ALICE)
    h2.take(h2.engine.shutdown(h2.now))
    _accounted(h2)


def test_a_tenant_of_weight_two_gets_twice_the_share_while_both_wait():
    from candidate_scheduler.core.tenants import TenantPolicy

    h = Harness(tenants=(TenantPolicy("robots", weight=2.0),))
    h.register("w1", capacity=1, max_batch=1)
    for i in range(60):  # both flood at once, one group each in turn
        _send(h, f"b{i}", BOB)
        _send(h, f"a{i}", ALICE)
    for _ in range(31):
        h.answer(h.work[-1])
    first = _started(h)[1:31]  # after the group that started before anyone waited
    assert sum(rid.startswith("a") for rid in first) == 20 and sum(rid.startswith("b") for rid in first) == 10
