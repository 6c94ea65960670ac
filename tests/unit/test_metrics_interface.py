"""Every metrics call the package makes names a SchedulerMetrics method that takes its arguments.

The engine records through `e.metrics` / `self.engine.metrics` as much as through `self.metrics`, and
its default sink (core/no_metrics.py) accepts any name and any arguments: a renamed method, or one
whose parameters changed, would only stop recording (or raise inside an engine event, answered as an
internal error) in a real scheduler. The calls are read from the source, so one added anywhere is
checked without a test of its own."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from candidate_scheduler.service.metrics import SchedulerMetrics

PACKAGE = Path(__file__).resolve().parents[2] / "candidate_scheduler"
# what holds the engine's metrics object: the engine itself (self), its rooms (e = self.engine), the shell
_RECEIVERS = {"self.metrics", "e.metrics", "self.engine.metrics", "engine.metrics", "e.engine.metrics"}


def metric_calls() -> list[tuple[str, int, str, int, tuple[str, ...]]]:
    """(file, line, method, positional arguments, keyword names) of every call on a metrics receiver."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func.value) in _RECEIVERS:
                assert not any(isinstance(a, ast.Starred) for a in node.args), ast.unparse(node)
                calls.append((str(path.relative_to(PACKAGE)), node.lineno, node.func.attr, len(node.args),
                              tuple(k.arg for k in node.keywords)))
    return calls


def problems(metrics: object) -> list[str]:
    found = []
    for file, line, name, positional, keywords in metric_calls():
        method = getattr(metrics, name, None)
        if not callable(method):
            found.append(f"{file}:{line}: {name}() is not a method")
            continue
        try:
            inspect.signature(method).bind(*[None] * positional, **dict.fromkeys(keywords))
        except TypeError as exc:
            found.append(f"{file}:{line}: {name}() {exc}")
    return found


def test_every_metrics_call_is_a_method_that_takes_its_arguments():
    assert problems(SchedulerMetrics(CollectorRegistry())) == []


def test_the_engine_rooms_calls_are_read_too():
    # the calls the rooms make through `e.metrics` (core/worker_link.py, intake.py, endings.py, control.py)
    names = {name for _file, _line, name, _n, _kw in metric_calls()}
    assert {"given_back", "worker_report", "forward", "served", "tenant_group", "retry", "cancellation"} <= names


@pytest.mark.parametrize("broken", ["missing", "signature"])
def test_a_renamed_method_or_a_changed_signature_is_caught(broken):
    class Broken(SchedulerMetrics):
        if broken == "missing":
            given_back = None
        else:
            def forward(self, rows: int) -> None:  # the engine passes (rows, seconds)
                return None

    found = problems(Broken(CollectorRegistry()))
    assert found and all(("given_back" if broken == "missing" else "forward") in p for p in found), found
