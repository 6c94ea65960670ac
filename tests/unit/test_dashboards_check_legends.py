"""`make dashboards-check` and a legend that names a label the query does not keep.

`sum(rate(x_total[5m]))` with the legend `{{outcome}}` is one line with an empty name where the panel
promises one line per outcome: the sum dropped the label (a `sum` without `by`). The check passed it.
"""

from __future__ import annotations

import pytest

from candidate_scheduler.service.metrics import PREFIX
from tests.unit.test_dashboards_check_expressions import _check

P = PREFIX


@pytest.mark.parametrize(
    "expr, legend, label",
    [
        (f"sum(rate({P}groups_completed_total[5m]))", "{{outcome}}", "outcome"),
        (f"sum by (socket) (rate({P}protocol_errors_total[5m]))", "{{socket}} / {{kind}}", "kind"),
        (f"sum(rate({P}retries_total[5m])) by (job)", "{{reason}}", "reason"),
        (f"sum without (outcome) (rate({P}groups_completed_total[5m]))", "{{outcome}}", "outcome"),
        (f"histogram_quantile(0.9, sum by (le) (rate({P}group_latency_seconds_bucket[5m])))", "{{outcome}}",
         "outcome"),
        # one side of the division keeps the label, the other does not: no series match
        (f"sum by (kind) (rate({P}conditioning_cache_lookups_total[5m])) / "
         f"sum(rate({P}conditioning_cache_lookups_total[5m]))", "{{kind}}", "kind"),
        (f"rate({P}queue_wait_seconds_count[5m])", "{{outcome}}", "outcome"),  # the series has no such label
    ],
)
def test_a_legend_label_the_query_drops_fails(tmp_path, expr, legend, label):
    problems = _check(tmp_path, expr, legend)
    assert any(f"legend {{{{{label}}}}}" in p and "'the panel'" in p for p in problems), problems


@pytest.mark.parametrize(
    "expr, legend",
    [
        (f"sum by (outcome) (rate({P}groups_completed_total[5m]))", "{{outcome}}"),
        (f"sum(rate({P}groups_completed_total[5m])) by (outcome)", "{{ outcome }}"),
        (f"histogram_quantile(0.99, sum by (le, outcome) (rate({P}group_latency_seconds_bucket[5m])))",
         "{{outcome}}"),
        (f"rate({P}groups_completed_total[5m])", "{{outcome}} on {{instance}}"),
        (f"sum by (instance) (rate({P}groups_joined_total[5m]))", "{{instance}}"),
        (f"sum(rate({P}groups_completed_total[5m]))", "answered"),
        (f"{P}build_info", "{{version}}"),
    ],
)
def test_a_legend_of_kept_labels_passes(tmp_path, expr, legend):
    assert _check(tmp_path, expr, legend) == []
