"""argparse types that more than one command line uses: the service's (cli.py) and the benchmark's
(bench/cli.py), which must refuse the same bad values the same way."""

from __future__ import annotations

import argparse
import math

from candidate_scheduler.core.access import check_name
from candidate_scheduler.core.margins import check_margin_quantile
from candidate_scheduler.core.tenants import TenantPolicy
from candidate_scheduler.core.worker_link import check_worker_id
from candidate_scheduler.service.endpoints import tcp_host_port
from candidate_scheduler.worker import call_rows as call_rows_rule


def margin_quantile(text: str) -> float:
    """argparse type of --deadline-margin-quantile."""
    try:
        return check_margin_quantile(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str, *, above_zero: bool) -> float:
    return _amount(text, "seconds", above_zero=above_zero)


def _amount(text: str, unit: str, *, above_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of {unit}: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (above_zero and value == 0):  # NaN passes every comparison after
        raise argparse.ArgumentTypeError(f"must be finite and {'>' if above_zero else '>='} 0 {unit}, not {text}")
    return value


def not_negative(text: str) -> float:
    """argparse type of an amount that may be 0 (MB of cache or memory budget, a test knob's seconds)."""
    return _amount(text, "units", above_zero=False)


def grace_seconds(text: str) -> float:
    """argparse type of --stop-grace-s and --leave-grace-s: finite and not negative (a NaN grace would never
    run out, and the stop would end only by the orchestrator's SIGKILL)."""
    return _seconds(text, above_zero=False)


def positive_seconds(text: str) -> float:
    """argparse type of a period that must pass (--liveness): finite and above 0."""
    return _seconds(text, above_zero=True)


def port(text: str) -> int:
    """argparse type of a port a socket binds, 0 for any free one: ZMQ takes 70000 as 70000 % 65536 and
    listens somewhere unasked."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 0-65535, not {text}")
    return value


def dial_endpoint(text: str) -> str:
    """argparse type of an endpoint a socket connects to: tcp://HOST:PORT (port 1-65535) or ipc://PATH. ZMQ
    refuses `tcp://host` (no port) only when the worker connects, as a traceback after the model loaded."""
    if text.startswith("ipc://") and len(text) > len("ipc://"):
        return text
    parts = tcp_host_port(text)
    if parts is None or not parts[1].isdigit() or not 1 <= int(parts[1]) <= 65535:
        raise argparse.ArgumentTypeError(f"not an endpoint to connect to: {text!r} (tcp://HOST:PORT, or ipc://PATH)")
    return text


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (--max-in-flight)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def worker_id(text: str) -> str:
    """argparse type of `worker --worker-id`: what the scheduler would refuse at registration, refused here."""
    try:
        return check_worker_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def call_rows(text: str) -> str:
    """argparse type of `worker --call-rows` (the adapter resolves it against its device)."""
    try:
        call_rows_rule.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def tenant_name(text: str) -> str:
    """argparse type of --tenant."""
    try:
        return check_name("tenant", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def principal_name(text: str) -> str:
    """argparse type of `keys --client/--token NAME`: also a file name in the key directory."""
    try:
        return check_name("principal", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tenant_limit(text: str) -> tuple[str, int]:
    """argparse type of --tenant-limit TENANT=N."""
    name, limit = _tenant_pair(text, "N")
    try:
        return TenantPolicy(name, int(limit)).name, int(limit)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tenant_weight(text: str) -> tuple[str, float]:
    """argparse type of --tenant-weight TENANT=W."""
    name, weight = _tenant_pair(text, "W")
    try:
        return TenantPolicy(name, weight=float(weight)).name, float(weight)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tenant_pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected TENANT={what}, got {text!r}")
    return name, value


def tenant_policies(limits: list[tuple[str, int]], weights: list[tuple[str, float]]) -> tuple[TenantPolicy, ...]:
    """One TenantPolicy per tenant named by --tenant-limit or --tenant-weight (the last value wins)."""
    limit, weight = dict(limits), dict(weights)
    return tuple(TenantPolicy(name, limit.get(name), weight.get(name, 1.0)) for name in sorted({*limit, *weight}))
