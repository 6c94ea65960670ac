"""One window of the deadline benchmark: one arm's groups sent open loop at one arrival schedule, and
what came of them (the summary, the scheduler's metrics over the window, the elastic contract)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from candidate_scheduler.bench.common import PROMPT, loadavg
from candidate_scheduler.bench.deadline_outcomes import latency_stats_ms, summarize
from candidate_scheduler.bench.deadline_parity import check_replies
from candidate_scheduler.bench.deadline_settings import ARMS, COUNT, REDUCER, DeadlineSettings
from candidate_scheduler.bench.open_loop import run_open_loop
from candidate_scheduler.bench.scrape import scrape, window_delta
from candidate_scheduler.service.client import make_request

PING_S = 0.1  # a PING this often while a window sends: the baseline of the refusal round trip


@dataclass
class Target:
    """What every window is sent to: the service, its observation, the deadline, the references."""

    request_endpoint: str
    control: object  # a blocking Client on the control socket (stats after each window)
    metrics_url: str | None
    image: np.ndarray
    settings: DeadlineSettings
    deadline_s: float
    references: dict[int, np.ndarray]


def requests_for(target: Target, arm: str, n: int) -> tuple[list, list[int]]:
    s = target.settings
    seeds = [s.seeds[k % len(s.seeds)] for k in range(n)]
    spec = ARMS[arm]
    reqs = [make_request(target.image, PROMPT, count=spec["count"], min_count=spec["min_count"], seed=seed,
                         deadline_s=target.deadline_s, reducer=REDUCER, return_candidates=True, **s.sampling)
            for seed in seeds]
    return reqs, seeds


def run_window(target: Target, arm: str, times: list[float], window_s: float) -> tuple[dict, list, list[float]]:
    """Send one arm's groups at `times`; returns (summary, outcomes, PING round trips)."""
    reqs, seeds = requests_for(target, arm, len(times))
    before = scrape(target.metrics_url)
    outcomes, pings = run_open_loop(target.request_endpoint, reqs, seeds, times,
                                    drain_s=target.deadline_s + target.settings.drain_extra_s, ping_s=PING_S)
    after = scrape(target.metrics_url)
    summary = summarize(outcomes, target.deadline_s, window_s)
    summary["ping_latency"] = latency_stats_ms(pings)
    summary["loadavg_1min"] = (loadavg() or [None])[0]
    summary["scheduler_metrics"] = window_delta(before, after)
    summary["parity"] = check_replies(outcomes, target.references, COUNT)
    stats = target.control.stats()
    summary["left_in_flight"] = stats.get("groups_in_flight")
    return summary, outcomes, pings
