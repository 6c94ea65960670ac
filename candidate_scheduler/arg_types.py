"""argparse types that more than one command line uses: the service's (cli.py) and the benchmark's
(bench/cli.py), which must refuse the same bad values the same way."""

from __future__ import annotations

import argparse

from candidate_scheduler.core.access import check_name
from candidate_scheduler.core.cost_model import check_margin_quantile
from candidate_scheduler.core.tenants import TenantPolicy


def margin_quantile(text: str) -> float:
    """argparse type of --deadline-margin-quantile."""
    try:
        return check_margin_quantile(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def tenant_limit(text: str) -> TenantPolicy:
    """argparse type of --tenant-limit TENANT=N."""
    name, sep, limit = text.partition("=")
    try:
        if not sep:
            raise ValueError(f"expected TENANT=N, got {text!r}")
        return TenantPolicy(name, int(limit))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
