"""argparse types that more than one command line uses: the service's (cli.py) and the benchmark's
(bench/cli.py), which must refuse the same bad values the same way."""

from __future__ import annotations

import argparse

from candidate_scheduler.core.cost_model import check_margin_quantile


def margin_quantile(text: str) -> float:
    """argparse type of --deadline-margin-quantile."""
    try:
        return check_margin_quantile(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
