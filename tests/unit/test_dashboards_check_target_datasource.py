"""`make dashboards-check` and a query wired to a fixed datasource.

Grafana runs a target with its own `datasource` against that one, whatever the panel's says: a panel on
`${datasource}` whose target names `{"uid": "abc123"}` (what Grafana's export writes after an edit)
queries a datasource that other sites do not have ("datasource not found"), or the wrong Prometheus.
The check looked at the panel's datasource only.
"""

from __future__ import annotations

import json

import pytest

from candidate_scheduler.service import dashboards_check as dc
from candidate_scheduler.service.metrics import PREFIX

VARIABLE = {"type": "prometheus", "uid": "${datasource}"}


def _check(tmp_path, target_datasource) -> list[str]:
    target = {"refId": "A", "expr": f"sum({PREFIX}workers_live)"}
    if target_datasource is not None:
        target["datasource"] = target_datasource
    dashboard = {
        "title": "temp",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [{"id": 1, "type": "timeseries", "title": "the panel", "datasource": VARIABLE,
                    "gridPos": {"h": 8, "w": 12, "x": 0, "y": 0}, "targets": [target]}],
    }
    (tmp_path / "d.json").write_text(json.dumps(dashboard))
    return dc.check(tmp_path)


@pytest.mark.parametrize("fixed", [{"type": "prometheus", "uid": "abc123"}, "Prometheus"])
def test_a_target_on_a_fixed_datasource_fails(tmp_path, fixed):
    problems = _check(tmp_path, fixed)
    assert any("'the panel'" in p and "refId A" in p and "datasource" in p for p in problems), problems


@pytest.mark.parametrize("wired", [VARIABLE, "${datasource}", None])
def test_a_target_on_the_variable_or_the_panels_passes(tmp_path, wired):
    assert _check(tmp_path, wired) == []
