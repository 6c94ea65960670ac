"""The label values other processes send the scheduler are in its closed sets, so they are not all
recorded as "other" (docs/metrics.md: a rising "other" is a bug to look at).

The sglang-compat bridge (compat/bridge.py) tallies what it saw and refused and reports it in
COMPAT_REPORT; the scheduler records the tallies as compat_requests_total{type} and
protocol_errors_total{socket="compat", kind}. The kinds are read from the bridge's source, so a kind
added there without a label here fails."""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import CollectorRegistry

from candidate_scheduler.service import metrics as m

BRIDGE = Path(__file__).resolve().parents[2] / "candidate_scheduler" / "compat" / "bridge.py"


def bridge_tallies() -> tuple[set[str], set[str]]:
    """(request types, error kinds) the bridge counts with `self._count(kind[, error=True])`."""
    requests, errors = set(), set()
    for node in ast.walk(ast.parse(BRIDGE.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_count"):
            continue
        error = any(k.arg == "error" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
        # a literal, or a conditional expression choosing between literals (its test is no kind)
        arg = node.args[0]
        choices = [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else [arg]
        kinds = {n.value for n in choices if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert len(kinds) == len(choices), ast.unparse(node)
        assert kinds, ast.unparse(node)
        (errors if error else requests).update(kinds)
    return requests, errors


def test_the_bridge_is_read():
    requests, errors = bridge_tallies()
    assert {"req", "ping"} <= requests and {"pickle_refused", "bad_frames"} <= errors


def test_every_compat_request_type_is_a_label():
    requests, _errors = bridge_tallies()
    assert requests <= set(m.COMPAT_REQUEST_TYPES), sorted(requests - set(m.COMPAT_REQUEST_TYPES))


def test_every_compat_refusal_is_counted_under_its_own_kind():
    _requests, errors = bridge_tallies()
    registry = CollectorRegistry()
    sm = m.SchedulerMetrics(registry)
    for kind in sorted(errors):
        sm.protocol_error("compat", kind, 2)  # as server.py records a COMPAT_REPORT
    recorded = {kind: registry.get_sample_value("candidate_scheduler_protocol_errors_total",
                                                {"socket": "compat", "kind": kind}) for kind in sorted(errors)}
    assert recorded == dict.fromkeys(sorted(errors), 2.0)
    assert registry.get_sample_value("candidate_scheduler_protocol_errors_total",
                                     {"socket": "compat", "kind": m.OTHER}) == 0
