"""A metric's HELP text must say what the engine records in it: an operator reads the HELP (Prometheus,
Grafana's tooltip), not the code."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from candidate_scheduler.service.metrics import PREFIX, SchedulerMetrics
from tests.unit.test_engine import Harness


def _help(registry: CollectorRegistry, name: str) -> str:
    (family,) = [f for f in registry.collect() if f.name == PREFIX + name]
    return family.documentation


def test_queued_groups_counts_groups_not_started_and_its_help_says_so():
    """queued_groups said "Groups admitted or waiting for a worker, not yet answered", but the engine sets
    it to the groups none of whose slices has started (core/engine.py queued_groups): a group running on
    a worker is unanswered and not counted. An operator reading the HELP took a busy fleet with a
    gauge of 0 for an idle one."""
    h = Harness()
    registry = CollectorRegistry()
    h.engine.metrics = SchedulerMetrics(registry)
    h.register("w1", capacity=2)
    h.submit("running", count=2, seed=1)  # fills the worker
    h.submit("waiting", count=2, seed=2)  # waits for it
    h.take(h.engine.tick(h.now))
    assert "running" in h.engine.groups and not h.replies.get("running")  # in flight, unanswered
    # the measure: the one group not started, not the two unanswered
    assert registry.get_sample_value(PREFIX + "queued_groups") == 1
    assert h.engine.stats()["queued_groups"] == 1
    doc = _help(registry, "queued_groups")
    assert "not yet answered" not in doc
    assert "started" in doc
