"""The stacked panel "Worker failures and graceful departures /s" draws each worker gone once.

A worker that leaves gracefully but says LEFT still holding work (its grace ran out) is counted in
worker_departures_total{outcome="unfinished"} and, as what it held is retried, in
worker_failures_total{kind="left_unfinished"} (core/worker_link.py, `left`). The panel stacks both
queries, so its height drew one such worker as two gone."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from candidate_scheduler.core.messages import Leaving, Left
from candidate_scheduler.service.metrics import SchedulerMetrics
from tests.unit.test_dashboard_panels import _panel
from tests.unit.test_engine import Harness

_QUERY = re.compile(r"sum by \((\w+)\) \(rate\((\w+)(?:\{(\w+)(!=|=)\"(\w+)\"\})?\[\$__rate_interval\]\)\)")


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for f in registry.collect() for s in f.samples]


def _stacked_increase(panel: dict, before, after) -> float:
    """The stacked height of the panel's series: each query's increase over the interval, summed."""
    total = 0.0
    for target in panel["targets"]:
        m = _QUERY.fullmatch(target["expr"])
        assert m, f"cannot read {target['expr']!r}"
        _by, name, label, op, value = m.groups()

        def picked(samples, name=name, label=label, op=op, value=value):
            return sum(v for n, labels, v in samples if n == name and (
                label is None or (labels.get(label) == value) == (op == "=")))

        total += picked(after) - picked(before)
    return total


def _losses(h: Harness, registry: CollectorRegistry, panel: dict, go) -> float:
    before = _samples(registry)
    go()
    return _stacked_increase(panel, before, _samples(registry))


def test_a_worker_that_left_unfinished_is_stacked_once():
    panel = _panel("Worker failures and graceful departures /s")
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    h = Harness()
    registry = CollectorRegistry()
    h.engine.metrics = SchedulerMetrics(registry)
    h.register("w1")
    h.register("w2")
    h.submit("g", count=2)
    holder = h.work[0].identity.decode()
    h.take(h.engine.worker_leaving(holder.encode(), Leaving(holder, 5.0), h.now))

    def left_unfinished():
        h.take(h.engine.worker_left(holder.encode(), Left(holder, "grace ran out"), h.now))

    assert _losses(h, registry, panel, left_unfinished) == 1
    assert holder not in h.engine.workers and holder not in h.engine.leaving


def test_a_worker_lost_and_one_that_left_finished_are_stacked_once_each():
    panel = _panel("Worker failures and graceful departures /s")
    h = Harness()
    registry = CollectorRegistry()
    h.engine.metrics = SchedulerMetrics(registry)
    h.register("w1")
    h.register("w2")
    h.take(h.engine.worker_leaving(b"w1", Leaving("w1", 5.0), h.now))

    def both_go():
        h.take(h.engine.worker_left(b"w1", Left("w1", "done"), h.now))
        h.advance(3600.0)  # w2's heartbeats lapse
        h.take(h.engine.tick(h.now))

    assert _losses(h, registry, panel, both_go) == 2
    assert not h.engine.workers and not h.engine.leaving
