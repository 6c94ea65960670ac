"""Grafana dashboards and provisioning, checked against SchedulerMetrics."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from candidate_scheduler.service import dashboards_check as dc
from candidate_scheduler.service.metrics import PREFIX, SchedulerMetrics

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
DASHBOARDS = GRAFANA / "dashboards"


def load(name):
    return json.loads((DASHBOARDS / name).read_text())


def make_dashboard(tmp_path, exprs, name="bad.json"):
    ds = {"type": "prometheus", "uid": "${datasource}"}
    dashboard = {
        "title": "temp",
        "schemaVersion": 39,
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [
            {"id": i + 1, "type": "timeseries", "title": f"panel {i}", "datasource": ds,
             "gridPos": {"h": 8, "w": 12, "x": 0, "y": 8 * i},
             "targets": [{"refId": "A", "expr": expr, "datasource": ds}]}
            for i, expr in enumerate(exprs)
        ],
    }
    (tmp_path / name).write_text(json.dumps(dashboard))
    return tmp_path


# --- the real dashboards --------------------------------------------------------------------------


def test_real_dashboards_pass(capsys):
    assert dc.check(GRAFANA) == []
    assert dc.main([str(GRAFANA)]) == 0
    assert "OK" in capsys.readouterr().out


def test_make_target_style_invocation_passes():
    result = subprocess.run(
        [sys.executable, "-m", "candidate_scheduler.service.dashboards_check", "grafana"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ["overview.json", "workers_admission.json"])
def test_dashboard_shape(name):
    d = load(name)
    assert d["uid"] and d["title"] and 36 <= d["schemaVersion"] <= 41
    variables = d["templating"]["list"]
    assert {"name": "datasource", "type": "datasource", "query": "prometheus"}.items() <= variables[0].items()
    ids = [p["id"] for p in dc._panels(d["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dc._panels(d["panels"]):
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"


def test_every_metric_is_on_some_dashboard():
    registry = CollectorRegistry()
    SchedulerMetrics(registry)
    queried = set().union(*(dc.metric_names_in(e) for _, _, e in dc.dashboard_queries(GRAFANA)))
    for fam in registry.collect():
        assert any(q == fam.name or q.startswith(fam.name + "_") for q in queried), fam.name


def test_required_views_are_present():
    titles = {p.lower() for _, p, _ in dc.dashboard_queries(DASHBOARDS / "overview.json")}
    for word in ("latency", "queue", "admission", "candidates per group", "occupancy", "forwards",
                 "stage time", "cancellations", "outcome"):
        assert any(word in t for t in titles), word
    exprs = " ".join(e for _, _, e in dc.dashboard_queries(DASHBOARDS / "overview.json"))
    for q in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({q}, " in exprs


def test_provisioning_files():
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/candidate_scheduler.yaml").read_text())
    provider = prov["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "${CANDIDATE_SCHEDULER_DASHBOARDS}"


# --- the check must be able to fail --------------------------------------------------------------


def test_undefined_metric_fails(tmp_path, capsys):
    good = f"sum(rate({PREFIX}groups_received_total[$__rate_interval]))"
    bad = f"sum(rate({PREFIX}groups_recieved_total[$__rate_interval]))"
    make_dashboard(tmp_path, [good, bad])
    assert dc.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "panel 1" in err and f"{PREFIX}groups_recieved_total" in err
    assert "panel 0" not in err


def test_undefined_metric_fails_as_a_process(tmp_path):
    make_dashboard(tmp_path, [f"{PREFIX}no_such_gauge"])
    result = subprocess.run(
        [sys.executable, "-m", "candidate_scheduler.service.dashboards_check", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert f"{PREFIX}no_such_gauge" in result.stderr


@pytest.mark.parametrize(
    "expr",
    [
        f"{PREFIX}physical_batches",  # a counter is stored as _total; the bare name has no series
        f"{PREFIX}group_latency_seconds",  # a histogram has no bare series either
        f"rate({PREFIX}queued_groups_total[5m])",  # a gauge has no _total
        "up",  # not ours
    ],
)
def test_wrong_suffixes_fail(tmp_path, expr):
    make_dashboard(tmp_path, [expr])
    assert any("undefined metric" in p for p in dc.check(tmp_path))


def test_dashboard_without_panels_fails(tmp_path):
    make_dashboard(tmp_path, [])
    assert any("no panels" in p for p in dc.check(tmp_path))
    assert dc.main([str(tmp_path)]) == 1


def test_empty_folder_fails(tmp_path):
    assert dc.check(tmp_path)


def test_hardcoded_datasource_fails(tmp_path):
    make_dashboard(tmp_path, [f"{PREFIX}workers_live"])
    d = json.loads((tmp_path / "bad.json").read_text())
    d["panels"][0]["datasource"] = {"type": "prometheus", "uid": "abc123"}
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert any("datasource" in p for p in dc.check(tmp_path))


def test_collapsed_row_panels_are_checked(tmp_path):
    make_dashboard(tmp_path, [f"{PREFIX}workers_live"])
    d = json.loads((tmp_path / "bad.json").read_text())
    hidden = dict(d["panels"][0], id=9, title="hidden", targets=[{"refId": "A", "expr": "nope_total"}])
    d["panels"].append({"id": 8, "type": "row", "title": "r", "collapsed": True,
                        "gridPos": {"h": 1, "w": 24, "x": 0, "y": 20}, "panels": [hidden]})
    (tmp_path / "bad.json").write_text(json.dumps(d))
    assert any("'hidden'" in p and "nope_total" in p for p in dc.check(tmp_path))


# --- PromQL name extraction -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, names",
    [
        ("foo_total", {"foo_total"}),
        ('foo_total{a="b", c=~"x|y"}', {"foo_total"}),
        ("sum by (le, mode) (rate(foo_bucket[$__rate_interval]))", {"foo_bucket"}),
        ("sum(rate(foo_bucket[5m])) by (le)", {"foo_bucket"}),
        ("histogram_quantile(0.99, sum without (instance) (rate(a_bucket[1h30m])))", {"a_bucket"}),
        ("rate(a_sum[5m]) / on(job) group_left(version) rate(a_count[5m])", {"a_sum", "a_count"}),
        ("a_total offset 5m and b_total unless c", {"a_total", "b_total", "c"}),
        ('topk(5, x{le="1e3", job="$job"}) > bool 1e3', {"x"}),
        ('count({__name__="real_name", job="j"})', {"real_name"}),
        ("max_over_time(g[1h:5m]) * 100 + inf", {"g"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
        ("sum(rate(x[${__interval}])) / scalar(vector(1))", {"x"}),
        ("a:recorded:rate5m", {"a:recorded:rate5m"}),
    ],
)
def test_metric_names_in(expr, names):
    assert dc.metric_names_in(expr) == names


def test_defined_metric_names_use_stored_series_names():
    names = dc.defined_metric_names(SchedulerMetrics(CollectorRegistry()))
    for name in (
        "groups_completed_total", "groups_completed_created",
        "group_latency_seconds_bucket", "group_latency_seconds_sum", "group_latency_seconds_count",
        "queued_groups", "build_info",
    ):
        assert PREFIX + name in names
    assert PREFIX + "groups_completed" not in names
    assert PREFIX + "group_latency_seconds" not in names
