"""The dashboards' panels against what the scheduler records: a panel's arithmetic must mean what its
title says once the series are fed by the engine, and a series must be drawn in its own unit."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from candidate_scheduler.core.messages import Heartbeat, Leaving
from candidate_scheduler.service import dashboards_check as dc
from candidate_scheduler.service.metrics import SchedulerMetrics
from tests.unit.test_engine import Harness

DASHBOARDS = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"


def _panel(title: str) -> dict:
    for file in sorted(DASHBOARDS.glob("*.json")):
        for panel in dc._panels(json.loads(file.read_text())["panels"]):
            if panel.get("title") == title:
                return panel
    raise AssertionError(f"no panel {title!r}")


def _totals(registry: CollectorRegistry) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _evaluate(expr: str, before: dict[str, float], after: dict[str, float], seconds: float) -> float:
    """The value of a panel expression made only of sum(rate(x[...])), sum(x) and arithmetic, as
    Prometheus would give it over `seconds` between two scrapes (a counter's rate is its increase over
    the interval). Anything else fails, so a panel rewritten beyond this reading is noticed here."""
    text = re.sub(r"sum\(rate\((\w+)\[\$__rate_interval\]\)\)",
                  lambda m: repr((after[m.group(1)] - before[m.group(1)]) / seconds), expr)
    text = re.sub(r"sum\((\w+)\)", lambda m: repr(after[m.group(1)]), text)
    assert re.fullmatch(r"[0-9.e+\-*/() ]+", text), f"cannot read {expr!r} (left: {text!r})"
    return eval(text)  # noqa: S307 - digits and operators only, checked above


def _beat(h: Harness, worker_id: str, busy_s: float) -> None:
    # a worker stepping all the time: its forwards fill the interval since its last heartbeat
    forwards = ((2, busy_s / 2, "fwd"), (2, busy_s / 2, "fwd"))
    h.take(h.engine.heartbeat(worker_id.encode(), Heartbeat(worker_id, (), None, forwards), h.now))


def test_workers_stepping_is_a_share_when_a_worker_is_leaving():
    # A leaving worker still runs what it holds, and its forwards are recorded (core/worker_link.py:
    # heartbeats of live and leaving workers); it is not in workers_live. Two workers stepping all the
    # time, one of them leaving, are 100% stepping, not 200%.
    h = Harness(batching="step")
    registry = CollectorRegistry()
    h.engine.metrics = SchedulerMetrics(registry)
    h.register("a", capacity=2)
    h.register("b", capacity=2)
    h.submit("g1", count=2, seed=1)
    h.submit("g2", count=2, seed=2)
    h.take(h.engine.worker_leaving(b"a", Leaving("a", 30.0), h.now))
    assert "a" in h.engine.leaving and "b" in h.engine.workers
    h.take(h.engine.tick(h.now))
    before = _totals(registry)
    h.advance(1.0)
    for worker_id in ("a", "b"):
        _beat(h, worker_id, 1.0)
    h.take(h.engine.tick(h.now))
    after = _totals(registry)
    (target,) = _panel("Workers stepping (share of their time)")["targets"]
    share = _evaluate(target["expr"], before, after, 1.0)
    assert abs(share - 1.0) < 1e-9, (target["expr"], share)


_UNITS_OF_A_SIZE = {"bytes", "decbytes", "bits", "decbits", "kbytes", "mbytes"}


def _unit_of(panel: dict, ref_id: str) -> str | None:
    config = panel.get("fieldConfig", {})
    unit = config.get("defaults", {}).get("unit")
    for override in config.get("overrides", []):
        matcher = override.get("matcher", {})
        if matcher.get("id") == "byFrameRefID" and matcher.get("options") == ref_id:
            for prop in override.get("properties", []):
                if prop.get("id") == "unit":
                    unit = prop.get("value")
    return unit


def test_a_count_is_never_drawn_as_bytes():
    # a rate of evictions drawn in bytes reads "3 B" on an axis of megabytes: flat at zero
    wrong = []
    for file in sorted(DASHBOARDS.glob("*.json")):
        for panel in dc._panels(json.loads(file.read_text())["panels"]):
            for target in panel.get("targets", []):
                names = dc.metric_names_in(target.get("expr", ""))
                if _unit_of(panel, target["refId"]) in _UNITS_OF_A_SIZE and not all("bytes" in n for n in names):
                    wrong.append((file.name, panel["title"], target["refId"], target["expr"]))
    assert not wrong
