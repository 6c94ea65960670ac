"""Check Grafana dashboards against the metrics the code defines.

    python -m candidate_scheduler.service.dashboards_check grafana

Exits non-zero, naming the dashboard, panel and expression, when a panel queries a series that
SchedulerMetrics does not export, or names exported series but selects nothing from them or plots
nonsense (a label or label value they never have, rate() of a gauge, delta() of a counter, buckets
added up across `le`: expression_problems; a legend naming a label the query drops: legend_problems),
when a dashboard has no panels, or when a panel or one of its queries is not wired to the
`${datasource}` variable. A renamed metric or label value then breaks `make dashboards-check` instead
of leaving a silently empty (or silently wrong) panel.

The PromQL reading is deliberately small: it strips strings, label matchers, range/offset durations,
grouping clauses and Grafana variables, then takes every remaining identifier that is not a function
call or keyword as a metric name. That is enough for the dashboards we write; an expression it cannot
read fails loudly rather than passing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
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


# Prometheus adds these to every series it scrapes: a panel may group or match on them.
_TARGET_LABELS = frozenset({"job", "instance"})
# Labels whose values are not a closed set in the code: the running build, the site's tenants.
_OPEN_LABELS = frozenset({"version", "python_version", "tenant"})
_NAMED_MATCHERS = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"""([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", re.IGNORECASE)
_COUNTER_FUNCTION = re.compile(r"\b(rate|irate|increase|resets)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
_GAUGE_FUNCTION = re.compile(r"\b(delta|idelta|deriv|predict_linear)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
# the series of counters and histograms: they only go up, save at a restart
_COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
_AGGREGATION = re.compile(
    r"\b(sum|avg|min|max|count|group|stddev|stdvar)\s*(?:(by|without)\s*\(([^()]*)\)\s*)?\(", re.IGNORECASE)
_TRAILING_GROUPING = re.compile(r"\s*(by|without)\s*\(([^()]*)\)", re.IGNORECASE)


def series_labels(metrics: SchedulerMetrics) -> dict[str, dict[str, set[str]]]:
    """{series name: {label: values}} as `metrics` exports them. SchedulerMetrics creates every labelled
    child at start-up, so the values at start-up are all the values there will ever be."""
    labels: dict[str, dict[str, set[str]]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            series = labels.setdefault(sample.name, {})
            for name, value in sample.labels.items():
                series.setdefault(name, set()).add(value)
    return labels


def gauge_names(metrics: SchedulerMetrics) -> set[str]:
    return {family.name for family in metrics.registry.collect() if family.type == "gauge"}


def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis closing the one at `opening` (len(text) if none does)."""
    depth = 0
    for i in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text)


def expression_problems(expr: str, labels: dict[str, dict[str, set[str]]], gauges: set[str]) -> list[str]:
    """What in `expr` selects nothing or plots nonsense, though every name in it is exported: a label
    (matched or grouped by) or an `=` / `!=` / plain `=~` / `!~` label value the series never has,
    rate() and the like of a gauge, delta() and the like of a counter, and a histogram's `_bucket`
    series added up across `le`. The reading is as small as metric_names_in's: enough for the
    dashboards we write."""
    problems = []
    text = _VARIABLE.sub("$", expr)  # a variable's value is the site's: never checked
    names = metric_names_in(expr)
    for name, matchers in _NAMED_MATCHERS.findall(text):
        known = labels.get(name)
        if known is None:
            continue  # an undefined name is reported on its own
        for label, op, quoted in _MATCHER.findall(matchers):
            if label == "__name__" or label in _TARGET_LABELS:
                continue
            if label not in known:
                problems.append(f"{name} has no label {label!r}")
                continue
            value = quoted[1:-1]
            if label in _OPEN_LABELS or "$" in value or (op == "!=" and not value):  # != "": has the label
                continue
            # a negative matcher on a value never exported excludes nothing: the panel plots everything
            if op in ("=", "!="):
                wanted = [value]
            elif op in ("=~", "!~") and re.fullmatch(r"[\w.+-]+(\|[\w.+-]+)*", value):
                wanted = value.split("|")  # a plain alternation: each must be a value
            else:
                continue
            for one in wanted:
                if one not in known[label]:
                    problems.append(f"{name} never has {label}={one!r} (it has {sorted(known[label])})")
    named = set().union(*(labels.get(n, {}).keys() for n in names)) if names else set()
    for _clause, listed in _LABEL_LIST.findall(text):
        for label in (x.strip() for x in listed.split(",")):
            if label and label not in named and label not in _TARGET_LABELS:
                problems.append(f"no series it selects has label {label!r}")
    for function, name in _COUNTER_FUNCTION.findall(text):
        if name in gauges:
            problems.append(f"{function}() of the gauge {name} (a gauge goes down; use delta() or the value)")
    for function, name in _GAUGE_FUNCTION.findall(text):
        if name in labels and name not in gauges and name.endswith(_COUNTER_SUFFIXES):
            problems.append(f"{function}() of the counter {name} (a restart reads as a fall; use rate() or increase())")
    # A bucket counts the observations at or below its le: added across le it is no count at all. Buckets
    # kept apart by le (`sum by (le)`, or no aggregation: a heatmap, a histogram_quantile) are sound, and
    # so is one bucket picked out by an le matcher; an aggregation that drops le over the rest is not.
    for function, keeps, inside in _aggregations(text):
        if not any(n.endswith("_bucket") for n in metric_names_in(inside)) or re.search(r"\ble\s*=", inside):
            continue
        if not keeps("le"):
            quantile = "histogram_quantile needs le kept" if "histogram_quantile" in text else "buckets added up"
            problems.append(f"{function}() over buckets without le: {quantile}")
    return problems


def _aggregations(text: str) -> Iterator[tuple[str, Callable[[str], bool], str]]:
    """(function, whether a label survives it, the text it aggregates) for each aggregation in `text`."""
    for match in _AGGREGATION.finditer(text):
        end = _closing(text, match.end() - 1)
        clause, listed = match.group(2), match.group(3)
        if clause is None:
            trailing = _TRAILING_GROUPING.match(text, end + 1)
            clause, listed = (trailing.group(1), trailing.group(2)) if trailing else ("by", "")  # bare: drops all
        named = {x.strip() for x in listed.split(",")} - {""}
        by = clause.lower() == "by"
        yield match.group(1), (lambda label, named=named, by=by: (label in named) == by), text[match.end():end]


_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_]\w*)\s*\}\}")


def legend_problems(expr: str, legend: str, labels: dict[str, dict[str, set[str]]]) -> list[str]:
    """The labels `legend` names ({{label}}) that no series of `expr` carries or an aggregation in it
    drops (a `sum` without `by`): Grafana draws those as an empty name, the lines it promised merged."""
    wanted = dict.fromkeys(x for x in _LEGEND_LABEL.findall(legend or "") if not x.startswith("__"))
    if not wanted or re.search(r"\blabel_(?:replace|join)\s*\(", expr):
        return []  # labels made by the query itself: not read here
    text = _VARIABLE.sub("$", expr)
    carried = set(_TARGET_LABELS).union(*(labels.get(n, {}).keys() for n in metric_names_in(expr)))
    problems = []
    for label in wanted:
        if label not in carried:
            problems.append(f"legend {{{{{label}}}}}: no series it selects has label {label!r}")
            continue
        for function, keeps, _inside in _aggregations(text):
            if not keeps(label):
                problems.append(f"legend {{{{{label}}}}}: {function}() drops label {label!r} (keep it with by)")
                break
    return problems


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
    labels, gauges = series_labels(metrics), gauge_names(metrics)
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
                # Grafana runs a target that names a datasource against it, whatever the panel's says
                if target.get("datasource") is not None and not _uses_variable(target["datasource"]):
                    problems.append(f"{where} refId {target.get('refId')}: datasource is not {DATASOURCE_VARIABLE}")
                expr = target.get("expr", "")
                if not expr.strip():
                    problems.append(f"{where} refId {target.get('refId')}: empty expr")
                    continue
                names = metric_names_in(expr)
                if not names:
                    problems.append(f"{where}: no metric name found in {expr!r}")
                for name in sorted(names - defined):
                    problems.append(f"{where}: undefined metric {name!r} in {expr!r}")
                for problem in expression_problems(expr, labels, gauges):
                    problems.append(f"{where}: {problem} in {expr!r}")
                for problem in legend_problems(expr, target.get("legendFormat", ""), labels):
                    problems.append(f"{where}: {problem} in {expr!r}")
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
