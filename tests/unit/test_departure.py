"""worker/leaving.py: when a leaving worker may go, and why."""

from __future__ import annotations

from candidate_scheduler.worker.leaving import FINISHED, GRACE_EXPIRED, NO_ACK, Departure


def test_it_goes_once_it_has_answered_everything_the_scheduler_counts_on():
    d = Departure(grace_s=10.0, now=0.0, ack_timeout_s=1.0)
    d.answered(7)  # answered after LEAVING went out, before the ack came back: the ack still lists it
    assert d.outcome(0.5, holding=True) is None  # no ack yet
    d.acknowledged([7, 8, 9])
    assert d.owed == {8, 9} and d.outcome(0.6, holding=True) is None
    d.answered(8)
    assert d.outcome(0.7, holding=True) is None  # 9 may still be on its way to us
    d.answered(9)
    assert d.outcome(0.8, holding=False) == FINISHED


def test_an_empty_ack_lets_it_go_at_once():
    d = Departure(grace_s=10.0, now=0.0, ack_timeout_s=1.0)
    d.acknowledged([])
    assert d.outcome(0.0, holding=False) == FINISHED


def test_the_grace_period_bounds_the_wait():
    d = Departure(grace_s=2.0, now=5.0, ack_timeout_s=1.0)
    d.acknowledged([1])
    assert d.outcome(6.9, holding=True) is None
    assert d.outcome(7.0, holding=True) == GRACE_EXPIRED
    assert Departure(grace_s=0.0, now=5.0, ack_timeout_s=1.0).outcome(5.0, holding=True) == GRACE_EXPIRED


def test_without_an_ack_an_idle_worker_goes_after_the_ack_timeout_and_a_busy_one_finishes_first():
    d = Departure(grace_s=30.0, now=0.0, ack_timeout_s=1.0)
    assert d.outcome(0.9, holding=False) is None
    assert d.outcome(1.0, holding=False) == NO_ACK
    assert d.outcome(5.0, holding=True) is None  # its results may still be read by a scheduler coming back
    assert d.outcome(30.0, holding=True) == GRACE_EXPIRED
