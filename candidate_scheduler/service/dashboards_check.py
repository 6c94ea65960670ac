"""Check Grafana dashboards against the metrics the code defines.

    python -m candidate_scheduler.service.dashboards_check grafana

Exits non-zero, naming the dashboard, panel and expression, when a panel queries a series that
SchedulerMetrics does not export, when a dashboard has no panels, or when a panel is not wired to the
`${datasource}` variable. A renamed metric then breaks `make dashboards-check` instead of leaving a
silently empty panel.

The PromQL reading is deliberately small: it strips strings, label matchers, range/offset durations,
grouping clauses and Grafana variables, then takes every remaining identifier that is not a function
call or keyword as a metric name. That is enough for the dashboards we write; an expression it cannot
read fails loudly rather than passing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from candidate_scheduler.service.metrics import SchedulerMetrics

DATASOURCE_VARIABLE = "${datasource}"

# The series names Prometheus stores for one metric family, by family type (text exposition format).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}

_KEYWORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2", "le", "start", "end",
})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# Grafana variables: $__rate_interval, ${datasource}, [[var]], $var.
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
# An identifier not glued to a preceding word/number character (so "5m" or "1e3" yield nothing).
_IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    names = set()
    # A name can also be given as {__name__="..."}; take it before the matchers are dropped.
    for match in re.finditer(r'__name__\s*=\s*"([^"]*)"', expr):
        names.add(match.group(1))
    text = _VARIABLE.sub(" ", expr)
    text = _STRING.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)  # [5m], [1h:1m]
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    for match in _IDENT.finditer(text):
        ident, call = match.group(1), match.group(2)
        if call or ident.lower() in _KEYWORDS:
            continue
        names.add(ident)
    return names


def defined_metric_names(metrics: SchedulerMetrics) -> set[str]:
    """Every series name that `metrics`' registry can expose (with _total/_bucket/... suffixes)."""
    names = set()
    for family in metrics.registry.collect():
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        # Collapsed rows keep their panels inside the row.
        yield from _panels(panel.get("panels", []))


def _dashboard_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*.json") if p.is_file())


def dashboard_queries(path: str | Path) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, expr) for every target of every panel under `path`."""
    queries = []
    for file in _dashboard_files(Path(path)):
        dashboard = json.loads(file.read_text())
        title = dashboard.get("title", file.name)
        for panel in _panels(dashboard.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append((title, panel.get("title", "?"), target["expr"]))
    return queries


def _uses_variable(datasource: object) -> bool:
    if isinstance(datasource, dict):
        return datasource.get("uid") == DATASOURCE_VARIABLE
    return datasource == DATASOURCE_VARIABLE


def check(path: str | Path, metrics: SchedulerMetrics | None = None) -> list[str]:
    """Every problem found under `path`, one line each; empty when all is well."""
    if metrics is None:
        metrics = SchedulerMetrics(CollectorRegistry())
    defined = defined_metric_names(metrics)
    files = _dashboard_files(Path(path))
    problems = []
    if not files:
        problems.append(f"{path}: no dashboard JSON files")
    for file in files:
        try:
            dashboard = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            problems.append(f"{file}: not JSON: {exc}")
            continue
        title = dashboard.get("title", file.name)
        panels = [p for p in _panels(dashboard.get("panels", [])) if p.get("type") != "row"]
        if not panels:
            problems.append(f"{file} ({title}): no panels")
        variables = [v for v in dashboard.get("templating", {}).get("list", [])
                     if v.get("type") == "datasource" and v.get("name") == "datasource"]
        if not variables:
            problems.append(f"{file} ({title}): no 'datasource' template variable")
        for panel in panels:
            where = f"{file.name} / {panel.get('title', '?')!r}"
            if "gridPos" not in panel:
                problems.append(f"{where}: no gridPos")
            targets = panel.get("targets", [])
            if panel.get("type") != "text" and not targets:
                problems.append(f"{where}: no targets")
            if targets and not _uses_variable(panel.get("datasource")):
                problems.append(f"{where}: datasource is not {DATASOURCE_VARIABLE}")
            for target in targets:
                expr = target.get("expr", "")
                if not expr.strip():
                    problems.append(f"{where} refId {target.get('refId')}: empty expr")
                    continue
                names = metric_names_in(expr)
                if not names:
                    problems.append(f"{where}: no metric name found in {expr!r}")
                for name in sorted(names - defined):
                    problems.append(f"{where}: undefined metric {name!r} in {expr!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "grafana")
    problems = check(path)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        print(f"dashboards check FAILED: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    queries = dashboard_queries(path)
    dashboards = len(_dashboard_files(path))
    names = set().union(*(metric_names_in(q[2]) for q in queries)) if queries else set()
    print(f"dashboards check OK: {dashboards} dashboard(s), {len(queries)} queries, "
          f"{len(names)} distinct series, all defined by SchedulerMetrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
