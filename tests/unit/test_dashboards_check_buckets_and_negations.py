"""`make dashboards-check` on two kinds of panel it judged wrongly.

- A histogram's buckets kept apart by `le` are no sum across buckets: `sum by (le) (rate(x_bucket[...]))`
  and a plain `rate(x_bucket[...])` are Grafana's own heatmap queries, and the check failed them as
  "buckets added up" because no histogram_quantile was around them. Buckets summed across `le` (a bare
  `sum`, `sum by (job)`, `sum without (le)`) are still refused, with or without histogram_quantile.
- A negative matcher on a value the series never has (`outcome!="sucess"`) excludes nothing: the panel
  silently plots everything. The check read only `=` and `=~` values.
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


def _problems(expr: str, exported) -> list[str]:
    labels, gauges = exported
    return dc.expression_problems(expr, labels, gauges)


@pytest.mark.parametrize(
    "expr",
    [
        # Grafana heatmap queries: one series per bucket, nothing added across le
        f"sum by (le) (rate({P}queue_wait_seconds_bucket[$__rate_interval]))",
        f"sum(rate({P}queue_wait_seconds_bucket[5m])) by (le)",
        f"sum by (le, outcome) (increase({P}group_latency_seconds_bucket[5m]))",
        f"rate({P}forward_seconds_bucket[5m])",
        # one bucket picked out, then its share of all observations
        f'sum(rate({P}queue_wait_seconds_bucket{{le="0.1"}}[5m])) / sum(rate({P}queue_wait_seconds_count[5m]))',
    ],
)
def test_buckets_kept_apart_by_le_are_not_added_up(expr, exported):
    assert _problems(expr, exported) == []


@pytest.mark.parametrize(
    "expr",
    [
        f"sum(rate({P}queue_wait_seconds_bucket[5m]))",
        f"sum by (job) (rate({P}queue_wait_seconds_bucket[5m]))",
        f"sum without (le) (rate({P}queue_wait_seconds_bucket[5m]))",
        f"sum(rate({P}batch_rows_bucket[5m])) / sum(rate({P}batch_rows_count[5m]))",
        # a quantile elsewhere in the expression does not excuse a sum across le beside it
        f"histogram_quantile(0.5, sum by (le) (rate({P}batch_rows_bucket[5m])))"
        f" / sum(rate({P}queue_wait_seconds_bucket[5m]))",
    ],
)
def test_buckets_summed_across_le_are_still_refused(expr, exported):
    assert any("buckets" in p for p in _problems(expr, exported)), _problems(expr, exported)


@pytest.mark.parametrize(
    "expr, why",
    [
        (f'sum(rate({P}groups_completed_total{{outcome!="sucess"}}[5m]))', "outcome='sucess'"),
        (f'sum(rate({P}admission_decisions_total{{reason!~"fits|fit"}}[5m]))', "reason='fit'"),
    ],
)
def test_a_negative_matcher_on_a_value_never_exported_is_refused(expr, why, exported):
    assert any(why in p for p in _problems(expr, exported)), _problems(expr, exported)


@pytest.mark.parametrize(
    "expr",
    [
        f'sum by (mode, reason) (rate({P}admission_decisions_total{{reason!="fits"}}[5m]))',
        f'sum(rate({P}protocol_errors_total{{kind!~"oversize|version"}}[5m]))',
        f'sum(rate({P}protocol_errors_total{{kind!~"over.*"}}[5m]))',  # a pattern: not a list of values
        f'sum(rate({P}tenant_groups_total{{tenant!="robots"}}[5m]))',  # tenants are the site's
        f'sum(rate({P}groups_completed_total{{outcome!=""}}[5m]))',  # "has the label": every series
    ],
)
def test_sound_negative_matchers_pass(expr, exported):
    assert _problems(expr, exported) == []
