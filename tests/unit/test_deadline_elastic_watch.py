"""The elastic count (core/deadlines.choose_count) watches the deadline groups behind it so that its rows do
not make them late. A group behind that misses its deadline even with this one at its minimum expires
whatever count this one gets: it must not hold this one at its minimum."""

from __future__ import annotations

from tests.unit.test_engine import Harness
from tests.unit.test_engine_deadlines import calibrated


def test_a_group_behind_that_will_expire_anyway_does_not_hold_an_elastic_count_at_its_minimum():
    h = Harness(batching="step")
    calibrated(h, "w1")  # 8 rows; a forward of r rows: 0.05 + 0.01 r seconds
    h.submit("R", count=8, steps=10)  # predicted 1.3 s
    h.submit("B", count=8, steps=10, deadline_s=3.0)  # after R: 2.6 s, in time
    assert "B" not in h.replies
    h.advance(1.9)  # R runs late: B, behind it, now ends 1.3 s from now at the earliest, past its 1.1 s left
    # due before B: ahead of it. Admitted at receipt: the only group it delays, B, is late without it too
    h.submit("E", count=8, steps=10, deadline_s=1.05, candidates_min=1)
    assert "E" not in h.replies
    h.answer(h.work[0])  # R is done at last; the worker is free
    # B waits for E's rows whatever E's count, and is late whatever E's count: E need not shrink to its
    # minimum for it, only as far as its own deadline asks (10 x (0.05 + 0.01 n) <= 1.05 s: n = 5)
    started = [(s.dispatch.request_id, len(s.dispatch.candidate_ids)) for w in h.work[1:] for s in w.slices]
    assert started == [("E", 5)], started
