"""`make dashboards-check` must also fail on a panel that names a real metric but selects nothing or
plots nonsense: a label or label value SchedulerMetrics never exports, rate() of a gauge, a
histogram's buckets added up across `le`."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from candidate_scheduler.service import dashboards_check as dc
from candidate_scheduler.service.metrics import PREFIX, SchedulerMetrics

P = PREFIX


VARIABLE = {"type": "prometheus", "uid": "${datasource}"}


def _check(tmp_path, expr: str, legend: str | None = None, target_datasource=VARIABLE) -> list[str]:
    """dashboards_check on one dashboard of one panel querying `expr` (with `legend`, its legendFormat;
    `target_datasource`, the query's own datasource, None for none: the panel's)."""
    ds = VARIABLE
    target = {"refId": "A", "expr": expr}
    if target_datasource is not None:
        target["datasource"] = target_datasource
    if legend is not None:
        target["legendFormat"] = legend
    dashboard = {
        "title": "temp",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [{"id": 1, "type": "timeseries", "title": "the panel", "datasource": ds,
                    "gridPos": {"h": 8, "w": 12, "x": 0, "y": 0}, "targets": [target]}],
    }
    (tmp_path / "d.json").write_text(json.dumps(dashboard))
    return dc.check(tmp_path)


@pytest.mark.parametrize(
    "expr, why",
    [
        (f'sum(rate({P}groups_completed_total{{outcom="done"}}[$__rate_interval]))', "label 'outcom'"),
        (f'sum(rate({P}groups_completed_total{{outcome="sucess"}}[5m]))', "outcome='sucess'"),
        (f'sum(rate({P}admission_decisions_total{{mode=~"atomic|split"}}[5m]))', "mode='split'"),
        (f'sum(rate({P}group_microbatches_bucket{{le="1"}}[5m]))', "le='1'"),  # stored as "1.0"
        (f"sum by (reason) (rate({P}worker_failures_total[5m]))", "label 'reason'"),
        (f"sum(rate({P}retries_total[5m])) by (kind)", "label 'kind'"),
        (f"rate({P}queued_groups[5m])", "rate() of the gauge"),
        (f"increase({P}workers_live[1h])", "increase() of the gauge"),
        (f"histogram_quantile(0.9, sum(rate({P}queue_wait_seconds_bucket[5m])))", "without le"),
        (f"histogram_quantile(0.9, sum by (outcome) (rate({P}group_latency_seconds_bucket[5m])))", "without le"),
        (f"histogram_quantile(0.9, sum(rate({P}queue_wait_seconds_bucket[5m])) by (job))", "without le"),
        (f"histogram_quantile(0.9, sum without (le) (rate({P}queue_wait_seconds_bucket[5m])))", "without le"),
        (f"sum(rate({P}queue_wait_seconds_bucket[5m]))", "buckets"),
    ],
)
def test_a_panel_that_selects_nothing_or_plots_nonsense_fails(tmp_path, expr, why):
    problems = _check(tmp_path, expr)
    assert any(why in p and "'the panel'" in p for p in problems), problems


@pytest.mark.parametrize(
    "expr",
    [
        # what the dashboards and tests/integration/test_prometheus.py write
        f'sum(increase({P}group_microbatches_bucket{{le="1.0"}}[5m])) < sum(increase({P}group_microbatches_count[5m]))',
        f'sum(increase({P}cancellations_total{{state=~"queued|admitted|running"}}[5m]))',
        f"histogram_quantile(0.99, sum by (le, outcome) (rate({P}group_latency_seconds_bucket[$__rate_interval])))",
        f"histogram_quantile(0.5, sum(rate({P}batch_rows_bucket[5m])) by (le))",
        f"histogram_quantile(0.5, rate({P}batch_rows_bucket[5m]))",
        f"sum(rate({P}forward_seconds_sum[$__rate_interval])) / sum({P}workers_live)",
        f'sum by (tenant) (rate({P}tenant_groups_total{{outcome="overloaded", tenant="$tenant"}}[5m]))',
        f'{P}build_info{{version="9.9.9"}}',  # build labels are the running build's: not a closed set
        f'sum(rate({P}tenant_candidates_total{{tenant="robots"}}[5m]))',  # tenants are configured per site
        f"delta({P}queued_groups[5m])",
        f'sum(rate({P}protocol_errors_total{{kind!="oversize"}}[5m]))',
    ],
)
def test_sound_queries_pass(tmp_path, expr):
    assert _check(tmp_path, expr) == []


def test_the_real_dashboards_still_pass():
    assert dc.check(dc.Path(__file__).resolve().parents[2] / "grafana", SchedulerMetrics(CollectorRegistry())) == []
