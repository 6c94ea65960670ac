"""A slice of a forward shape every live worker refuses (core/fleet_rows.py) that goes back to pending after
the planning pass failed that shape's pending groups -- it was running then, and is retried later -- must
fail too: no live worker will ever take it, and a group without a deadline otherwise waits for good."""

from __future__ import annotations

import pytest

from tests.unit.test_engine import Harness, submission

BIG = {"height": 128, "width": 128}  # another forward shape than the default's


@pytest.mark.parametrize("how", ["worker_error", "lost"])
def test_a_slice_of_a_refused_shape_retried_after_the_refusal_is_answered_not_queued_for_good(how):
    h = Harness(batching="step")
    h.register("w1", capacity=2)
    h.submit("a", count=1, seed=1)
    h.submit("b", count=1, seed=2)  # joins a's running batch: its own assignment, running too
    # another shape waits: it cannot join that batch, and keeps the planning passes running meanwhile
    h.take(h.engine.submit(("client", "c"), submission("c", count=1, seed=3, sampling=BIG), h.now))
    first, second = h.work
    assert [s.dispatch.request_id for s in first.slices] == ["a"]
    assert [s.dispatch.request_id for s in second.slices] == ["b"]
    # one row of a's shape ran the only worker out of memory: it refuses the shape, a fails
    h.answer(first, status="error", error_code="out_of_memory", report={"oom_rows": 1, "oom_step": 1})
    assert h.reply("a").error_code == "out_of_memory"
    assert "b" not in h.replies  # b was running: nothing said yet
    assert "c" not in h.replies
    # b's attempt then fails through no fault of its shape: it goes back to pending
    if how == "worker_error":
        h.answer(second, status="error", error_code="worker_error")
    else:  # the worker no longer lists it: lost on the link
        h.advance(h.engine.config.heartbeat_timeout_s + 1)
        h.beat("w1", running=())
    for _ in range(3):  # the worker answers what it is sent and beats, the scheduler ticks
        h.run_all()
        h.advance(1.0)
        h.beat("w1")
        h.take(h.engine.tick(h.now))
    assert h.reply("c").status == "done"
    assert len([w for w in h.work if any(s.dispatch.request_id == "b" for s in w.slices)]) == 1  # never resent
    r = h.reply("b")
    assert (r.status, r.error_code) == ("failed", "out_of_memory")
    assert not h.engine.groups and not len(h.engine.pending)


def test_a_slice_larger_than_every_worker_that_still_takes_its_shape_is_halved_and_runs():
    """The worker that refuses a shape is the largest: the slices of that shape must fit the largest worker
    that still takes it, or they wait for good though a worker could run them in halves."""
    h = Harness()
    h.register("w1", capacity=2)
    h.submit("a", count=1, seed=1)
    h.submit("b", count=2, seed=2)  # sized for w1 alone: one slice of two rows, waiting behind a
    h.register("w0", capacity=1)
    [first] = h.work
    assert first.identity == b"w1"
    # one row of the shape ran w1 out of memory: it refuses the shape; w0, one row, still takes it
    h.answer(first, status="error", error_code="out_of_memory", report={"oom_rows": 1, "oom_step": 1})
    for _ in range(4):
        h.run_all()
        h.advance(0.5)
        h.beat("w0")
        h.beat("w1")
        h.take(h.engine.tick(h.now))
    assert h.reply("a").status == "done"
    r = h.reply("b")
    assert r.status == "done" and r.metrics["microbatches"] == 2
    assert {w.identity for w in h.work[1:]} == {b"w0"}


def test_under_the_reject_policy_a_group_is_sized_for_the_largest_worker_that_takes_its_shape():
    """`--policy reject` runs a group whole on one worker or refuses it: the one worker must be one that takes
    its shape. Sized for the largest (which refuses it), a group no other worker holds was admitted and then
    waited for good, neither run nor answered."""
    h = Harness(policy="reject")
    h.register("w1", capacity=4)
    h.submit("a", count=1, seed=1)
    h.register("w0", capacity=2)
    [first] = h.work
    assert first.identity == b"w1"
    h.answer(first, status="error", error_code="out_of_memory", report={"oom_rows": 1, "oom_step": 1})
    h.run_all()  # a runs on w0
    assert h.reply("a").status == "done"
    assert h.engine.stats()["workers"]["w1"]["refuses"] and not h.engine.stats()["workers"]["w0"]["refuses"]
    h.submit("fits", count=2, seed=2)  # w0 holds it whole
    h.submit("b", count=4, seed=3)  # only w1 holds four, and it refuses the shape
    for _ in range(3):
        h.run_all()
        h.advance(0.5)
        h.beat("w0")
        h.beat("w1")
        h.take(h.engine.tick(h.now))
    assert h.reply("fits").status == "done"
    r = h.reply("b")
    assert (r.status, r.error_code) == ("rejected", "does_not_fit")
    assert not h.engine.groups
