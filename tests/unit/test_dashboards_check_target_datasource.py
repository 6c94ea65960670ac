"""`make dashboards-check` and a query wired to a fixed datasource.

Grafana runs a target with its own `datasource` against that one, whatever the panel's says: a panel on
`${datasource}` whose target names `{"uid": "abc123"}` (what Grafana's export writes after an edit)
queries a datasource that other sites do not have ("datasource not found"), or the wrong Prometheus.
The check looked at the panel's datasource only.
"""

from __future__ import annotations

import pytest

from candidate_scheduler.service.metrics import PREFIX
from tests.unit.test_dashboards_check_expressions import VARIABLE
from tests.unit.test_dashboards_check_expressions import _check as check_one_panel


def _check(tmp_path, target_datasource) -> list[str]:
    return check_one_panel(tmp_path, f"sum({PREFIX}workers_live)", target_datasource=target_datasource)


@pytest.mark.parametrize("fixed", [{"type": "prometheus", "uid": "abc123"}, "Prometheus"])
def test_a_target_on_a_fixed_datasource_fails(tmp_path, fixed):
    problems = _check(tmp_path, fixed)
    assert any("'the panel'" in p and "refId A" in p and "datasource" in p for p in problems), problems


@pytest.mark.parametrize("wired", [VARIABLE, "${datasource}", None])
def test_a_target_on_the_variable_or_the_panels_passes(tmp_path, wired):
    assert _check(tmp_path, wired) == []
