"""A load point's verdict (bench/load_point.py): a group not answered `done` is not served within the SLO,
however fast its answer came, so a point whose groups fail fast must not pass -- it would set an arm's
capacity (the highest load whose p99 stays within the SLO) at a load the arm does not serve."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from candidate_scheduler.bench import load_point
from candidate_scheduler.bench.load_point import Outcome, Planned, PointRun, run_point, summarise


def _planned(n: int, rate: float) -> list[Planned]:
    return [Planned(at_s=i / rate, count=1, request=SimpleNamespace(request_id=f"g-{i}")) for i in range(n)]


def _run(statuses: list[str], latency_s: float, rate: float = 10.0) -> PointRun:
    outcomes = [Outcome(p, status=s, latency_s=latency_s) for p, s in zip(_planned(len(statuses), rate), statuses)]
    return PointRun(rate, outcomes, stopped_early=False, wall_s=1.0)


def test_a_point_whose_groups_all_failed_fast_does_not_pass():
    row = summarise(_run(["failed"] * 20, latency_s=0.01), slo_s=1.0)
    assert row["p99_s"] < 1.0  # the latencies themselves are short
    assert row["p99_within_slo"] is False
    assert row["goodput_groups_per_s"] == 0.0


def test_one_group_refused_among_done_ones_fails_the_point_and_all_done_in_time_passes():
    assert summarise(_run(["done"] * 19 + ["rejected"], latency_s=0.01), slo_s=1.0)["p99_within_slo"] is False
    assert summarise(_run(["done"] * 20, latency_s=0.01), slo_s=1.0)["p99_within_slo"] is True
    assert summarise(_run(["done"] * 20, latency_s=2.0), slo_s=1.0)["p99_within_slo"] is False


class _FailingClient:
    """An arm that answers every group at once, `failed`."""

    def __init__(self, endpoint, liveness_s=None):
        self.sent = 0

    async def submit_request(self, request):
        self.sent += 1
        await asyncio.sleep(0)
        return SimpleNamespace(status="failed", metrics={}, candidates=None)

    def close(self):
        pass


def test_fast_failures_count_towards_the_early_stop(monkeypatch):
    from candidate_scheduler.service import async_client

    monkeypatch.setattr(async_client, "AsyncClient", _FailingClient)
    planned = _planned(40, rate=200.0)
    run = run_point("tcp://unused", 200.0, planned, slo_s=5.0, early_stop=True, drain_timeout_s=5.0)
    row = summarise(run, 5.0)
    assert row["p99_within_slo"] is False
    # the verdict is known once enough groups failed: the rest are not sent
    assert run.stopped_early and len(run.sent) < len(planned)
    assert len(run.sent) >= load_point.over_slo_needed(len(planned))
