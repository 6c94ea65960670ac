"""When a scheduler stopping gracefully may go (core/graceful_stop.py), as a table."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.graceful_stop import GracefulStop, Verdict

STOP = GracefulStop(began=100.0, grace_s=25.0)


@pytest.mark.parametrize(("now", "in_flight", "workers", "verdict"), [
    (100.0, 3, 2, Verdict.SERVE),  # asked just now, groups in flight
    (124.9, 1, 1, Verdict.SERVE),  # the last moment of the grace
    (100.0, 0, 2, Verdict.FINISHED),  # nothing in flight: go at once
    (110.0, 0, 1, Verdict.FINISHED),  # the last group answered within the grace
    (125.0, 0, 1, Verdict.FINISHED),  # nothing left when the grace ends: finished, not expired
    (100.0, 0, 0, Verdict.FINISHED),  # nothing in flight and no fleet: finished
    (125.0, 2, 1, Verdict.GRACE_EXPIRED),
    (500.0, 1, 0, Verdict.GRACE_EXPIRED),
    (101.0, 4, 0, Verdict.NO_WORKERS),  # the fleet went with it: nobody will serve them
])
def test_verdicts(now, in_flight, workers, verdict):
    assert STOP.verdict(now, in_flight, workers) is verdict


def test_until_is_the_end_of_the_grace():
    assert STOP.until == 125.0
    assert GracefulStop(7.0, 0.0).verdict(7.0, 1, 1) is Verdict.GRACE_EXPIRED


class _Worker:
    def __init__(self, holds: int):
        self.assignments = {i: object() for i in range(holds)}


def test_a_leaving_worker_that_holds_nothing_serves_nobody():
    """It takes no new work: with queued groups and no live worker, the stop need not wait out its grace
    for a leaving worker that never says LEFT."""
    from candidate_scheduler.core.graceful_stop import serving_workers

    assert serving_workers({}, [_Worker(0)]) == 0
    assert serving_workers({}, [_Worker(2), _Worker(0)]) == 1
    assert serving_workers({"w1": _Worker(0)}, [_Worker(1)]) == 2  # a live one serves, holding or not
    assert STOP.verdict(101.0, 3, serving_workers({}, [_Worker(0)])) is Verdict.NO_WORKERS
