"""Step batching with prefetch: the assignments one pass sends a worker (core/schedule._together). The
worker admits them whole, in arrival order, each once all its rows are free (worker/running.py), so a
unit that waits there for rows must not be overtaken by a later one sent ahead of it into the free rows
it waits for, nor bundled with later units whose rows free only later than its own."""

from __future__ import annotations

import math

from tests.unit.test_engine import Harness, submission


def _sent(h: Harness) -> list[tuple[str, ...]]:
    return [tuple(s.dispatch.request_id for s in w.slices) for w in h.work]


def _worker_running(*groups: tuple[str, int, int]) -> Harness:
    """One worker of 8 rows under step batching, spare rows given at once, running `groups`
    (request id, count, steps), each sent as its own assignment."""
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    h.register("w1", capacity=8)
    for rid, count, steps in groups:
        h.submit(rid, count=count, steps=steps)
    return h


def _burst(h: Harness, *groups: tuple[str, int, int]) -> None:
    """(request id, count, steps) submitted as one burst, then one planning pass, as the shell does."""
    for rid, count, steps in groups:
        h.take(h.engine.submit(("c", rid), submission(rid, count=count, steps=steps), h.now, plan=False))
    h.take(h.engine.plan(h.now))


def test_a_later_unit_does_not_take_the_free_rows_a_held_head_waits_for():
    h = _worker_running(("running", 6, 4))  # 2 rows left free
    # one burst, planned once: the head needs the whole worker, a long group behind it fits the 2 free rows
    _burst(h, ("head", 8, 4), ("later", 2, 100))
    # both wait on the worker; sent in queue order, the head is admitted first when the running group ends
    assert _sent(h) == [("running",), ("head",), ("later",)]
    h.answer(h.work[0])
    h.run_all()
    assert h.reply("head").status == "done" and h.reply("later").status == "done"


def test_units_that_fit_the_free_rows_still_start_at_once_beside_a_held_one():
    h = _worker_running(("running", 4, 4))  # 4 rows left free
    _burst(h, ("now", 2, 4), ("wait", 8, 4))
    assert _sent(h) == [("running",), ("now",), ("wait",)]
    assert [w.join for w in h.work] == [False, True, True]


def test_units_that_wait_for_rows_freed_at_different_times_are_not_bundled():
    h = _worker_running(("short", 6, 4), ("long", 2, 100))  # full; its rows free at two different times
    _burst(h, ("head", 6, 4), ("next", 2, 4))
    # in one assignment of 8 rows the head would wait for the long group's rows too: the worker admits an
    # assignment whole, once all its rows are free; alone it starts when the short group's 6 rows free
    assert _sent(h) == [("short",), ("long",), ("head",), ("next",)]
    h.run_all()
    assert h.reply("head").status == "done" and h.reply("next").status == "done"


def test_units_that_wait_for_one_batch_still_go_together():
    h = _worker_running(("batch", 8, 4))  # one assignment: its rows free all at once
    _burst(h, ("x", 4, 4), ("y", 4, 4))
    assert _sent(h) == [("batch",), ("x", "y")]
