"""The deadline heap (Engine.expiries) follows the groups in flight: a group answered before its deadline
leaves an entry that used to stay until the deadline passed -- up to an hour (MAX_DEADLINE_S) -- so a
busy scheduler whose clients ask for long deadlines kept an hour of traffic's entries in memory."""

from __future__ import annotations

from tests.unit.test_engine import Harness


def test_answered_groups_do_not_pile_up_in_the_deadline_heap():
    h = Harness()
    h.register("w1", capacity=8)
    answered = 1500
    for i in range(answered):
        h.submit(f"g{i}", count=1, seed=i, deadline_s=3600.0)
        if i % 2:
            h.run_all()  # answered long before its deadline
        else:
            h.take(h.engine.cancel(f"g{i}", h.now)[1])
    assert len(h.replies) == answered and all(len(r) == 1 for r in h.replies.values())
    assert not h.engine.groups
    # O(groups in flight), not O(groups answered within the last deadline)
    assert len(h.engine.expiries) < answered // 4


def test_the_deadlines_of_groups_in_flight_survive_the_heap_being_trimmed():
    h = Harness()
    h.register("w1", capacity=1)
    h.submit("blocker", count=1, steps=1000)  # holds the only worker: the groups below wait
    for i in range(40):
        h.submit(f"late{i}", count=1, seed=i, deadline_s=5.0)
    for i in range(1500):  # groups answered at once, pushing entries while the late ones wait
        h.submit(f"x{i}", count=1, seed=i, deadline_s=3600.0)
        h.take(h.engine.cancel(f"x{i}", h.now)[1])
    h.advance(6.0)
    h.take(h.engine.tick(h.now))
    for i in range(40):
        assert h.reply(f"late{i}").status == "expired"
