"""Backfill (core/deadlines.backfiller) on a worker where two slices of one group run, joined at different
times: the head's rows are free when the first of them ends, not when the group's last slice does."""

from __future__ import annotations

from candidate_scheduler.core.messages import Registration
from tests.unit.test_engine import Harness, capability
from tests.unit.test_engine_deadlines import LABEL, calibrated


def _placed(h: Harness) -> list[str]:
    return [s.dispatch.request_id for w in h.work for s in w.slices]


def test_a_backfill_must_end_before_the_first_slice_that_frees_the_heads_rows_not_its_groups_last():
    h = Harness(batching="step")
    calibrated(h, "small", capacity=4)  # slices are sized for it: 4 rows at most
    profile = tuple((LABEL, r, 0.05 + 0.01 * r) for r in (1, 5, 10))  # a forward of r rows: 0.05 + 0.01 r
    h.take(h.engine.register(b"big", Registration("big", capability(16), 10, profile=profile), h.now))
    h.submit("long", count=4, steps=1000)  # fills "small" for good
    h.submit("F", count=4, steps=1000)  # 4 of big's 10 rows for good
    h.submit("X", count=3, steps=30)
    h.submit("A", count=5, steps=40)  # slices of 3 and 2: the 3 join big now, the 2 once X is done
    assert _placed(h) == ["long", "F", "X", "A"]
    h.advance(30 * 0.15)
    h.answer(next(w for w in h.work if w.slices[0].dispatch.request_id == "X"))
    assert _placed(h)[-1] == "A"  # its second slice joins big 4.5 s after its first: 1 row left free
    assert h.engine.snapshot(h.now).worker("big").free_rows == 1
    # the head needs 4 rows: big's 1 free and the 3 of A's first slice, 10 steps of 10 rows from now
    # (1.1 s); A's second slice ends 3.5 s later. Reserved for the head, big may be backfilled only with
    # work done within 1.1 s -- each step of a backfilled row there takes 0.15 s
    h.submit("H", count=4, steps=4)
    h.submit("late", count=1, steps=20)  # 3.0 s: it would hold the head's 4th row for 1.9 s
    h.submit("quick", count=1, steps=4)  # 0.6 s: done before the head could start anyway
    placed = _placed(h)[5:]
    assert placed == ["quick"], placed
