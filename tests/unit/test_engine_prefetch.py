"""Prefetch (EngineConfig.prefetch): a worker may be sent work beyond what it can start, which waits on
the worker and starts at its first step boundary with room (worker/running.py) instead of a round trip
later. It is used only when no worker can start the work now."""

from __future__ import annotations

from tests.unit.test_engine import Harness, submission


def test_dispatch_sends_a_busy_worker_its_next_batch_after_every_idle_one_has_work():
    h = Harness(prefetch=1)
    h.register("w1", capacity=4)
    h.submit("g1", count=4)  # w1 runs it
    h.register("w2", capacity=4)
    h.submit("g2", count=4)  # w2 is idle: it goes there, not behind g1
    assert [(w.identity, w.slices[0].dispatch.request_id) for w in h.work] == [(b"w1", "g1"), (b"w2", "g2")]
    h.submit("g3", count=4)
    h.submit("g4", count=4)
    h.submit("g5", count=4)  # each worker holds one running and one next: g5 waits at the scheduler
    assert [(w.identity, w.slices[0].dispatch.request_id, w.join) for w in h.work[2:]] == [
        (b"w1", "g3", False), (b"w2", "g4", False)]  # a BATCH: it runs after the current one, on its own
    h.answer(h.work[0])
    assert (h.work[-1].identity, h.work[-1].slices[0].dispatch.request_id) == (b"w1", "g5")
    h.run_all()
    assert all(h.reply(f"g{i}").status == "done" for i in range(1, 6))


def test_step_holds_up_to_one_batch_of_rows_beyond_capacity_and_only_when_nothing_is_free():
    h = Harness(batching="step", prefetch=1)
    h.register("w1", capacity=4)
    h.submit("a", count=3, steps=8)
    h.register("w2", capacity=4)
    h.submit("b", count=2, steps=8)  # w2 has 4 free rows, w1 one: best fit among what runs now is w2
    h.submit("c", count=1, steps=8)  # w1's last free row
    assert [(w.identity, w.slices[0].dispatch.request_id) for w in h.work] == [(b"w1", "a"), (b"w2", "b"),
                                                                               (b"w1", "c")]
    h.submit("d", count=2, steps=8)  # w2's free rows first
    h.submit("e", count=4, steps=8)  # nothing free: held by a worker, to start when rows free there
    h.submit("f", count=4, steps=8)
    h.submit("g", count=4, steps=8)  # 2 x 4 rows each is all they may hold: g waits at the scheduler
    placed = {w.slices[0].dispatch.request_id: w for w in h.work}
    assert placed["d"].identity == b"w2" and placed["e"].join and placed["f"].join and "g" not in placed
    assert {placed["e"].identity, placed["f"].identity} == {b"w1", b"w2"}
    for w in h.engine.workers.values():
        assert w.rows_in_use <= 2 * 4
    h.run_all()
    assert all(h.reply(r).status == "done" for r in "abcdefg")


def test_no_prefetch_sends_only_what_can_start():
    h = Harness(prefetch=0)
    h.register("w1", capacity=4)
    h.submit("g1", count=4)
    h.submit("g2", count=4)
    assert len(h.work) == 1


def test_a_burst_placed_in_one_pass_never_hands_a_worker_more_rows_than_it_runs_in_one_assignment():
    h = Harness(batching="step", prefetch=1)
    h.register("w1", capacity=8)
    for i in range(20):  # the shell plans once after a burst of submissions
        h.take(h.engine.submit(("client", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert [(sum(len(s.dispatch.candidate_ids) for s in w.slices), w.join) for w in h.work] == [(8, False), (8, True)]
    h.run_all()
    assert all(h.reply(f"g{i}").status == "done" for i in range(20))


def test_spare_rows_never_take_a_slice_larger_than_the_worker_runs():
    # a worker whose rows shrank (out of memory, a memory cap) after a slice was sized for a larger one
    from candidate_scheduler.core.planning import Unit, WorkerSlot

    shrunk = WorkerSlot("w", capacity=4, free_rows=4, forward_key=None, spare=4)
    wide = Unit("g", 0, tuple(range(6)), ("bk",), ("fk",))
    assert not shrunk.accepts(wide)  # 4 + 4 rows to hold, but it runs 4 at once: it would run out again
    assert shrunk.accepts(Unit("h", 0, tuple(range(4)), ("bk",), ("fk",)))


def test_a_worker_told_fewer_rows_gets_them_in_every_assignment():
    h = Harness(batching="step", prefetch=1)
    h.register("w1", capacity=8)
    h.engine.workers["w1"].capacity = 5  # as an out-of-memory incident leaves it
    h.engine.rows_changed()
    h.submit("g", count=2)
    assert h.work[-1].rows == 5
