"""Step batching with prefetch: the assignments one pass sends a worker (core/schedule._together). The
worker admits them whole, in arrival order, each once all its rows are free (worker/running.py), so a
unit that waits there for rows must not be overtaken by a later one sent ahead of it into the free rows
it waits for, nor bundled with later units whose rows free only later than its own."""

from __future__ import annotations

import math

from tests.unit.test_engine import Harness, submission


def _sent(h: Harness) -> list[tuple[str, ...]]:
    return [tuple(s.dispatch.request_id for s in w.slices) for w in h.work]


def test_a_later_unit_does_not_take_the_free_rows_a_held_head_waits_for():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    h.register("w1", capacity=8)
    h.submit("running", count=6, steps=4)  # 2 rows left free
    # one burst, planned once: the head needs the whole worker, a long group behind it fits the 2 free rows
    h.take(h.engine.submit(("c", "head"), submission("head", count=8, steps=4), h.now, plan=False))
    h.take(h.engine.submit(("c", "later"), submission("later", count=2, steps=100), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    # both wait on the worker; sent in queue order, the head is admitted first when the running group ends
    assert _sent(h) == [("running",), ("head",), ("later",)]
    h.answer(h.work[0])
    h.run_all()
    assert h.reply("head").status == "done" and h.reply("later").status == "done"


def test_units_that_fit_the_free_rows_still_start_at_once_beside_a_held_one():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    h.register("w1", capacity=8)
    h.submit("running", count=4, steps=4)  # 4 rows left free
    h.take(h.engine.submit(("c", "now"), submission("now", count=2, steps=4), h.now, plan=False))
    h.take(h.engine.submit(("c", "wait"), submission("wait", count=8, steps=4), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert _sent(h) == [("running",), ("now",), ("wait",)]
    assert [w.join for w in h.work] == [False, True, True]


def test_units_that_wait_for_rows_freed_at_different_times_are_not_bundled():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    h.register("w1", capacity=8)
    h.submit("short", count=6, steps=4)
    h.submit("long", count=2, steps=100)  # the worker is full; its rows free at two different times
    h.take(h.engine.submit(("c", "head"), submission("head", count=6, steps=4), h.now, plan=False))
    h.take(h.engine.submit(("c", "next"), submission("next", count=2, steps=4), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    # in one assignment of 8 rows the head would wait for the long group's rows too: the worker admits an
    # assignment whole, once all its rows are free; alone it starts when the short group's 6 rows free
    assert _sent(h) == [("short",), ("long",), ("head",), ("next",)]
    h.run_all()
    assert h.reply("head").status == "done" and h.reply("next").status == "done"


def test_units_that_wait_for_one_batch_still_go_together():
    h = Harness(batching="step", prefetch=1, prefetch_lead_s=math.inf)
    h.register("w1", capacity=8)
    h.submit("batch", count=8, steps=4)  # one assignment: its rows free all at once
    for rid in ("x", "y"):
        h.take(h.engine.submit(("c", rid), submission(rid, count=4, steps=4), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert _sent(h) == [("batch",), ("x", "y")]
