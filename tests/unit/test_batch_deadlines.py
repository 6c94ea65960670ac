"""A dispatch batch is filled without making a deadline group in it late (core/batch_deadlines.py): a
filler due later waits for the next batch instead of stretching every forward of the urgent group's; the
forecast fills its simulated batches the same way, so the urgent group is admitted, not refused."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.batch_deadlines import BatchDeadlines
from candidate_scheduler.core.planning import Unit
from tests.unit.test_engine import Harness
from tests.unit.test_engine_deadlines import calibrated


def _unit(rid: str, rows: int) -> Unit:
    return Unit(rid, 0, tuple(range(rows)), ("k",), ("f",), (0.0, 0, 0), steps=10, cost_rows=rows, label="x")


def _batch(deadlines: dict[str, float], start: float = 0.0) -> BatchDeadlines:
    # a batch runs 0.1 s per row in it
    return BatchDeadlines(start, lambda units: 0.1 * sum(u.cost_rows for u in units), deadlines.get)


def test_without_a_deadline_in_the_batch_anything_that_fits_joins():
    batch = _batch({"late-filler": 0.5})
    batch.add(_unit("head", 4))
    assert batch.allows(_unit("late-filler", 4))


def test_a_filler_joins_only_while_the_urgent_group_stays_in_time():
    batch = _batch({"urgent": 0.75})
    batch.add(_unit("urgent", 4))  # 0.4 s alone
    assert batch.allows(_unit("a", 3))  # 0.7 s
    assert not batch.allows(_unit("b", 4))  # 0.8 s: past 0.75
    batch.add(_unit("a", 3))
    assert not batch.allows(_unit("c", 1))  # 0.8 s now
    assert batch.allows(_unit("d", 0))


def test_a_batch_starting_later_has_less_room():
    later = _batch({"urgent": 0.75}, start=0.3)
    later.add(_unit("urgent", 4))  # ends 0.7 s
    assert not later.allows(_unit("a", 1))


def test_a_group_late_anyway_does_not_keep_fillers_out():
    batch = _batch({"hopeless": 0.2, "urgent": 1.0})
    batch.add(_unit("hopeless", 4))  # 0.4 s: late whatever joins
    assert batch.allows(_unit("a", 4))  # 0.8 s: urgent is not in yet, hopeless was late anyway
    batch.add(_unit("urgent", 1))  # 0.5 s
    assert batch.allows(_unit("b", 5))  # 1.0 s: urgent just in time
    assert not batch.allows(_unit("c", 6))  # 1.1 s: would make urgent late


# ---- the engine: one worker of 8 rows whose forward of r rows takes 0.05 + 0.01 r s (10 steps: 0.9 s at
# 4 rows, 1.3 s at 8)

def _urgent_behind_loose(urgent_deadline_s: float, calibrate: bool = True) -> Harness:
    h = Harness()
    if calibrate:
        calibrated(h, "w1")
    else:
        h.register("w1", capacity=8)
    h.submit("busy", count=8, steps=10)  # the worker is busy for 1.3 s
    h.submit("loose", count=4, steps=10, deadline_s=10.0)
    h.submit("urgent", count=4, steps=10, deadline_s=urgent_deadline_s)  # ahead of `loose`: due sooner
    return h


def _batches(h: Harness) -> list[list[str]]:
    return [[s.dispatch.request_id for s in w.slices] for w in h.work]


def test_the_engine_runs_the_urgent_group_alone_when_a_filler_would_make_it_late():
    # alone: 1.3 + 0.9 = 2.2 s, in time for 2.3; with `loose` in its batch: 1.3 + 1.3 = 2.6 s, late.
    # The forecast fills its batches the same way: `urgent` is admitted, not refused as late
    h = _urgent_behind_loose(2.3)
    assert "urgent" not in h.replies
    h.advance(1.3)
    h.answer(h.work[0])
    assert _batches(h) == [["busy"], ["urgent"]]
    h.run_all()
    assert _batches(h) == [["busy"], ["urgent"], ["loose"]]
    assert all(h.reply(rid).status == "done" for rid in ("busy", "urgent", "loose"))


@pytest.mark.parametrize("urgent_deadline_s,calibrate", [(3.0, True), (2.3, False)])
def test_a_filler_still_joins_when_the_urgent_group_has_room_or_nothing_is_forecast(urgent_deadline_s, calibrate):
    h = _urgent_behind_loose(urgent_deadline_s, calibrate)
    h.advance(1.3)
    h.answer(h.work[0])
    assert _batches(h) == [["busy"], ["urgent", "loose"]]


def test_a_slice_of_a_group_in_the_batch_is_not_kept_out_by_that_groups_deadline():
    # kept out, the second slice would end a batch later: its group would finish later still
    batch = _batch({"g": 0.75, "other": 0.85})
    batch.add(_unit("g", 4))  # 0.4 s
    assert batch.allows(_unit("g", 4))  # 0.8 s: past g's deadline, but g needs this slice anyway
    assert not batch.allows(_unit("x", 4))  # a filler of another group still may not
    batch.add(_unit("other", 1))  # 0.5 s
    assert not batch.allows(_unit("g", 4))  # 0.9 s: `other` would be late, and g's own sake does not outweigh it
