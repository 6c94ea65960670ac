"""worker/leaving.py: when a leaving worker may go, and why."""

from __future__ import annotations

from candidate_scheduler.worker.leaving import FINISHED, GRACE_EXPIRED, NO_ACK, Departure


def test_it_goes_once_it_has_answered_everything_it_holds_of_what_the_scheduler_counts_on():
    d = Departure(grace_s=10.0, now=0.0, ack_timeout_s=1.0)
    d.answered(7)  # answered after LEAVING went out, before the ack came back: the ack still lists it
    assert d.outcome(0.5, holding=True) is None  # no ack yet
    d.acknowledged([7, 8, 9, 12], held=[8, 9])  # 12 never arrived: lost on the link, the scheduler retries it
    assert d.owed == {8, 9} and d.lost_on_link == 1 and d.outcome(0.6, holding=True) is None
    d.answered(8)
    assert d.outcome(0.7, holding=True) is None
    d.answered(9)
    assert d.outcome(0.8, holding=False) == FINISHED


def test_an_empty_ack_lets_it_go_at_once():
    d = Departure(grace_s=10.0, now=0.0, ack_timeout_s=1.0)
    d.acknowledged([], held=[])
    assert d.outcome(0.0, holding=False) == FINISHED


def test_the_grace_period_bounds_the_wait():
    d = Departure(grace_s=2.0, now=5.0, ack_timeout_s=1.0)
    d.acknowledged([1], held=[1])
    assert d.outcome(6.9, holding=True) is None
    assert d.outcome(7.0, holding=True) == GRACE_EXPIRED
    assert Departure(grace_s=0.0, now=5.0, ack_timeout_s=1.0).outcome(5.0, holding=True) == GRACE_EXPIRED


def test_unanswered_it_asks_again_and_goes_idle_at_once_or_busy_when_its_grace_ends():
    idle = Departure(grace_s=30.0, now=0.0, ack_timeout_s=1.0)
    assert idle.outcome(0.9, holding=False) is None
    assert idle.outcome(1.0, holding=False) == NO_ACK
    busy = Departure(grace_s=3.5, now=0.0, ack_timeout_s=1.0)
    asked = []
    for tick in range(1, 60):
        now = tick * 0.1
        if busy.outcome(now, holding=True) is not None:
            break
        if busy.ask_again(now):
            asked.append(round(now, 1))
    # a scheduler that does not answer may still read its results: it keeps at its work until the grace
    assert asked == [1.0, 2.0, 3.0] and busy.outcome(now, holding=True) == GRACE_EXPIRED and round(now, 1) == 3.5
    acked = Departure(grace_s=30.0, now=0.0, ack_timeout_s=1.0)
    acked.acknowledged([4], held=[4])
    assert not acked.ask_again(5.0) and acked.outcome(5.0, holding=True) is None  # answered: it waits for 4
