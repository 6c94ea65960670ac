"""Reading the scheduler's Prometheus /metrics around a benchmark window: the change in the deadline
counters and in the cost model's error histogram (`prediction_ratio`: actual over predicted time of
each assignment), so a window's misses can be told apart by cause."""

from __future__ import annotations

import math
import urllib.request

PREFIX = "candidate_scheduler_"
COUNTERS = ("deadline_refusals_total", "deadline_misses_total", "requested_candidates_total",
            "served_candidates_total", "groups_joined_total")
RATIO = "prediction_ratio"


def scrape(url: str | None, timeout_s: float = 5.0) -> dict[str, float]:
    """{series (name + labels): value} of one scrape; {} without a metrics URL."""
    if not url:
        return {}
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    text = urllib.request.urlopen(url, timeout=timeout_s).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def _bucket_le(series: str) -> float:
    le = series.split('le="', 1)[1].split('"', 1)[0]
    return math.inf if le == "+Inf" else float(le)


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus-style histogram_quantile over cumulative (le, count) buckets."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width > 0 else 1.0)
        prev_le, prev_count = le, count
    return prev_le


def window_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """What changed between two scrapes: the deadline counters and the prediction-ratio histogram
    (count, mean, p50/p90 by interpolation, and the share of assignments that ran > 25% over their
    prediction)."""
    if not after:
        return {}
    delta = {c: after.get(PREFIX + c, 0.0) - before.get(PREFIX + c, 0.0) for c in COUNTERS}
    head = PREFIX + RATIO + "_bucket"
    buckets = sorted((_bucket_le(k), v - before.get(k, 0.0)) for k, v in after.items() if k.startswith(head))
    n = after.get(PREFIX + RATIO + "_count", 0.0) - before.get(PREFIX + RATIO + "_count", 0.0)
    total = after.get(PREFIX + RATIO + "_sum", 0.0) - before.get(PREFIX + RATIO + "_sum", 0.0)
    at_125 = next((c for le, c in buckets if le >= 1.25), n)
    delta[RATIO] = {
        "assignments": int(n),
        "mean": total / n if n > 0 else None,
        "p50": _quantile(buckets, 0.5),
        "p90": _quantile(buckets, 0.9),
        "over_125": (n - at_125) / n if n > 0 else None,
    }
    return delta
