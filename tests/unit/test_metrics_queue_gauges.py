"""The queue gauges agree with each other and with the engine: a group waiting for a first worker is a
queued group (queued_groups says so) and its candidates are queued candidates -- with no worker up (a
cold start, the whole fleet lost) queued_candidates said 0 beside N queued groups, the signal a capacity
alert or an autoscaler reads."""

from __future__ import annotations

from tests.unit.test_engine import Harness
from tests.unit.test_metrics_engine_counts import _value, _with_metrics


def test_candidates_of_groups_waiting_for_a_first_worker_are_queued():
    h = Harness()
    registry = _with_metrics(h)
    h.submit("a", count=3)
    h.submit("b", count=5)
    h.take(h.engine.tick(h.now))
    assert _value(registry, "queued_groups") == 2
    assert _value(registry, "queued_candidates") == 3 + 5
    assert h.engine.stats()["queued_candidates"] == 3 + 5


def test_the_queue_gauges_count_each_candidate_once_as_groups_wait_then_run():
    h = Harness()
    registry = _with_metrics(h)
    h.submit("a", count=3)
    h.register("w1", capacity=2)  # "a" is admitted (sliced 2 + 1) and its first slice starts
    h.submit("b", count=4)  # admitted at once, behind "a"
    h.take(h.engine.tick(h.now))
    assert len(h.work) == 1 and sum(len(s.dispatch.candidate_ids) for s in h.work[0].slices) == 2
    assert _value(registry, "queued_groups") == 1  # "b": "a" has started
    assert _value(registry, "queued_candidates") == 1 + 4  # a's second slice, and all of b
    h.run_all()
    h.take(h.engine.tick(h.now))
    assert (_value(registry, "queued_groups"), _value(registry, "queued_candidates")) == (0, 0)
