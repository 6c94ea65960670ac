"""A tenant's lead in fair queueing (core/fair_queue.py) is "the work it already has waiting ahead of this
group". A group that leaves the queue before any worker took it -- cancelled, failed, shut down -- no
longer waits: it must not keep counting in its tenant's lead, or a tenant that cancels a backlog goes
behind another tenant's flood for work it never got."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.access import Principal, Role
from candidate_scheduler.core.fair_queue import UNIT_S, FairClock
from tests.unit.test_engine import Harness, submission

ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "rl", Role.CLIENT)


def _send(h: Harness, rid: str, who: Principal) -> None:
    h.take(h.engine.submit(("c", rid), submission(rid, steps=4), h.now, principal=who))


def _batch_of(h: Harness, rid: str) -> int:
    return next(i for i, w in enumerate(h.work) if any(s.dispatch.request_id == rid for s in w.slices))


def test_a_group_that_leaves_unstarted_gives_its_work_back_to_its_tenants_lead():
    c = FairClock()
    c.stamp("b", 8, 1.0)  # another tenant keeps the queue from going idle (which would forget everything)
    stamps = [c.stamp("a", 8, 1.0) for _ in range(3)]
    assert [lead for _tag, lead in stamps] == pytest.approx([0.0, 8 * UNIT_S, 16 * UNIT_S])
    for tag, _lead in stamps:
        c.left(tag, started=False)  # all three cancelled while they waited
    assert c.stamp("a", 8, 1.0)[1] == pytest.approx(0.0)  # nothing of a's waits ahead of it


def test_only_the_groups_that_left_are_given_back_and_a_started_one_is_not():
    c = FairClock()
    c.stamp("b", 8, 1.0)
    first, second, third = (c.stamp("a", 8, 2.0)[0] for _ in range(3))  # weight 2: 4 units each
    c.left(first, started=True)  # taken by a worker: its work was served
    c.left(third, started=False)
    # the virtual time is at the first's tag (0); the second still waits: a's next goes behind it alone
    assert c.stamp("a", 8, 2.0) == (pytest.approx(8.0), pytest.approx(8 * UNIT_S))
    assert second == 4.0


def test_a_tenant_that_cancels_its_backlog_is_not_held_behind_another_tenants_flood():
    # one worker of 8 rows; bob floods 200 one-candidate groups; alice queues 100 and cancels them all
    h = Harness()
    h.register("w1")
    for i in range(200):
        _send(h, f"b{i}", BOB)
    for i in range(100):
        _send(h, f"a{i}", ALICE)
    for i in range(100):
        h.take(h.engine.cancel(f"a{i}", h.now, ALICE)[1])
    assert all(h.reply(f"a{i}").status == "cancelled" for i in range(100))
    h.answer(h.work[-1])  # a batch of bob's ran meanwhile
    _send(h, "alice", ALICE)
    h.run_all()
    # as if she had never queued the cancelled ones: the batch running, then hers
    assert _batch_of(h, "alice") <= 2, _batch_of(h, "alice")
    assert all(h.reply(f"b{i}").status == "done" for i in range(200))
