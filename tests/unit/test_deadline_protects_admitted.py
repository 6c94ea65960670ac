"""Refusal at receipt keeps the promises made first (core/deadlines.refuse_at_receipt): a deadline group
that could finish in time only by going ahead of a group admitted before it, and making that one late,
is refused at once, instead of the earlier group expiring at its deadline. A newcomer that harms nobody
that was in time, or nobody at all, is admitted as before; so is a joiner that only slows running groups."""

from __future__ import annotations

from candidate_scheduler.core.messages import Left
from tests.unit.test_engine import Harness
from tests.unit.test_engine_deadlines import calibrated

# one worker of 8 rows whose profile says a forward takes 0.05 + 0.01 * rows s: 8 rows x 10 steps = 1.3 s


def _queued_behind_busy(relaxed_deadline_s: float) -> Harness:
    h = Harness()
    calibrated(h, "w1")
    h.submit("busy", count=8, steps=10)  # runs now: 1.3 s
    h.submit("relaxed", count=8, steps=10, deadline_s=relaxed_deadline_s)  # next: done at ~2.6 s
    assert "relaxed" not in h.replies  # admitted: in time behind `busy`
    return h


def test_a_newcomer_that_would_make_an_admitted_group_late_is_refused_at_once():
    h = _queued_behind_busy(2.8)
    # due sooner, so it would go ahead of `relaxed`: itself done at ~2.6 s (in time), `relaxed` at ~3.9 s (late)
    h.submit("urgent", count=8, steps=10, deadline_s=2.7)
    r = h.reply("urgent")
    assert (r.status, r.error_code) == ("rejected", "deadline_unmeetable")
    assert "only by making 1 group(s) admitted before it miss theirs" in r.error
    assert "within its deadline of 2.700 s" in r.error
    h.run_all()
    assert h.reply("relaxed").status == "done"
    assert [w.slices[0].dispatch.request_id for w in h.work] == ["busy", "relaxed"]


def test_a_newcomer_is_admitted_when_the_group_it_passes_has_room_for_it():
    h = _queued_behind_busy(4.5)  # in time even behind `urgent` (~3.9 s)
    h.submit("urgent", count=8, steps=10, deadline_s=2.7)
    assert "urgent" not in h.replies
    h.run_all()
    assert [w.slices[0].dispatch.request_id for w in h.work] == ["busy", "urgent", "relaxed"]


def test_a_group_late_anyway_does_not_keep_a_newcomer_out():
    """Only groups in time without the newcomer count: one that will miss its deadline whatever happens
    (here: a worker left after it was admitted) is no reason to refuse a newcomer that fits."""
    h = Harness()
    calibrated(h, "w1")
    calibrated(h, "w2")
    h.submit("busy1", count=8, steps=10)
    h.submit("busy2", count=8, steps=10)  # both workers busy for 1.3 s
    h.submit("c", count=8, steps=10, deadline_s=2.65)  # ~2.6 s on the first worker free
    h.submit("a", count=8, steps=10, deadline_s=2.7)  # ~2.6 s on the other
    assert "c" not in h.replies and "a" not in h.replies
    h.take(h.engine.worker_left(b"w2", Left("w2", "finished"), h.now))  # one worker now: `a` ends ~3.9 s, late
    h.submit("n", count=1, steps=1, deadline_s=2.69)  # after `c`, before `a`: ~2.66 s, in time; `a` later still
    assert "n" not in h.replies  # admitted: the only group it delays was late anyway
    h.submit("m", count=1, steps=1, deadline_s=2.64)  # before `c`, which it would make late (~2.66 s)
    assert "admitted before it" in h.reply("m").error


def test_under_step_batching_a_joiner_that_slows_a_running_deadline_group_is_still_admitted():
    """Running groups are not watched at receipt: refusing joiners that slow them cost more groups in time
    than it saved from expiring in the step-mode simulations (bench/README.md)."""
    h = Harness(batching="step")
    calibrated(h, "w1")
    h.submit("running", count=4, steps=20, deadline_s=1.9)  # 4 rows: 20 x 0.09 s = 1.8 s alone
    h.submit("joiner", count=4, steps=5, deadline_s=1.0)  # its 4 rows make every shared step 0.13 s
    assert "joiner" not in h.replies
