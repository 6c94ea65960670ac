"""When a resubmitting client takes the run that answers for the next one (service/next_run.py)."""

from __future__ import annotations

from candidate_scheduler.service.next_run import NOT_RUN_BY_A_STOPPING_SCHEDULER, NextRun


def test_another_incarnation_is_the_next_run_the_stopping_one_is_not():
    nxt = NextRun("run-1", liveness_s=3.0)
    assert not nxt.answered_by("run-1")  # still serving what it admitted
    assert nxt.answered_by("run-2")
    nxt.unanswered()  # it went away; its own PONG later (a lost PING) is still not the next run
    assert not nxt.answered_by("run-1")


def test_a_scheduler_that_says_no_incarnation_counts_as_back_after_a_silence():
    for stopping in (None, ""):
        nxt = NextRun(stopping, liveness_s=3.0)
        assert not nxt.answered_by(None) and not nxt.answered_by("")
        nxt.unanswered()
        assert nxt.answered_by(None) and nxt.answered_by("")
        assert NextRun(stopping, 3.0).answered_by("run-2")  # a known one is another run at once


def test_probes_start_short_and_double_up_to_the_liveness():
    nxt = NextRun("run-1", liveness_s=3.0)
    seen = [nxt.probe_s]
    for _ in range(6):
        nxt.unanswered()
        seen.append(nxt.probe_s)
    assert seen == [0.25, 0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert NextRun("run-1", liveness_s=None).longest_s == 1.0


def test_only_a_stopping_schedulers_answers_are_sent_again():
    assert ("failed", "shutting_down") in NOT_RUN_BY_A_STOPPING_SCHEDULER
    assert ("rejected", "stopping") in NOT_RUN_BY_A_STOPPING_SCHEDULER
    assert ("rejected", "draining") not in NOT_RUN_BY_A_STOPPING_SCHEDULER  # an operator's drain
    assert ("rejected", "overloaded") not in NOT_RUN_BY_A_STOPPING_SCHEDULER
