"""`make dashboards-check` and delta() (or deriv()) of a counter.

delta() and deriv() are for gauges: on a counter they read a restart (the counter back at 0) as a huge
negative change, and delta() does not extrapolate to counter semantics -- Prometheus documents that they
should only be used with gauges. The check refused rate() of a gauge but let the mirror mistake pass.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from candidate_scheduler.service import dashboards_check as dc
from candidate_scheduler.service.metrics import PREFIX, SchedulerMetrics

P = PREFIX


@pytest.fixture(scope="module")
def exported():
    metrics = SchedulerMetrics(CollectorRegistry())
    return dc.series_labels(metrics), dc.gauge_names(metrics)


@pytest.mark.parametrize(
    "expr, name",
    [
        (f"sum(delta({P}groups_completed_total[5m]))", "groups_completed_total"),
        (f"deriv({P}worker_heartbeats_total[5m])", "worker_heartbeats_total"),
        (f"sum(idelta({P}queue_wait_seconds_count[5m]))", "queue_wait_seconds_count"),
        (f"histogram_quantile(0.5, sum by (le) (delta({P}batch_rows_bucket[5m])))", "batch_rows_bucket"),
        (f"predict_linear({P}group_latency_seconds_sum[1h], 3600)", "group_latency_seconds_sum"),
    ],
)
def test_delta_of_a_counter_fails(expr, name, exported):
    labels, gauges = exported
    problems = dc.expression_problems(expr, labels, gauges)
    assert any(P + name in p and "counter" in p for p in problems), problems


@pytest.mark.parametrize(
    "expr",
    [
        f"delta({P}queued_groups[5m])",
        f"deriv({P}conditioning_cache_bytes[10m])",
        f"sum(increase({P}groups_completed_total[5m]))",
    ],
)
def test_delta_of_a_gauge_and_increase_of_a_counter_pass(expr, exported):
    labels, gauges = exported
    assert dc.expression_problems(expr, labels, gauges) == []
