"""A worker a planning pass keeps idle for a staggered start (dispatch, core/stagger.py) is not left idle
when the pass's own placements end the stagger (the backlog fell below deep): the engine asks for a
planning pass at once, instead of waiting almost a batch for the next event."""

from __future__ import annotations

from tests.unit.test_engine import Harness, submission
from tests.unit.test_engine_deadlines import calibrated


def test_a_worker_released_from_a_staggered_start_is_planned_for_at_once():
    h = Harness(prefetch=1)
    calibrated(h, "w1", capacity=1)
    calibrated(h, "w2", capacity=1)
    for i in range(16):  # a burst, read before one planning pass, as the shell does
        h.take(h.engine.submit(("client", f"g{i}"), submission(f"g{i}", count=1, steps=10), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert [w.identity for w in h.work] == [b"w1"]  # the pass kept w2 back for a staggered start...
    assert h.engine.held_back == {}  # ...which the backlog it left no longer calls for
    assert h.engine.wake_at == h.now  # so the shell plans again now (it was ~0.6 s: w2 idle meanwhile)
    h.take(h.engine.plan(h.now))
    assert sorted(w.identity for w in h.work[:2]) == [b"w1", b"w2"]
    # nothing more to release: the next wake-up is a real one again, not a spin
    assert h.engine.wake_at is None or h.engine.wake_at > h.now
