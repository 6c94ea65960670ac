"""The heartbeat interval a worker takes from the scheduler's REGISTERED (worker/loop.py): whatever number
arrives there, the worker's I/O thread keeps serving. An infinite one used to end `serve` with an
OverflowError (its poll timeout, `int(inf * 250)`), taking the worker down at registration."""

from __future__ import annotations

import math

import pytest

from candidate_scheduler import protocol
from candidate_scheduler.worker.loop import (
    MAX_HEARTBEAT_INTERVAL_S,
    MIN_HEARTBEAT_INTERVAL_S,
    Worker,
    heartbeat_interval,
)
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.integration.played_scheduler import PlayedScheduler


@pytest.mark.parametrize("sent", [math.inf, 1e300, -math.inf, math.nan, -1.0, 0.0])
def test_an_interval_out_of_range_is_clamped_to_a_finite_one(sent):
    value = heartbeat_interval(sent)
    assert math.isfinite(value) and MIN_HEARTBEAT_INTERVAL_S <= value <= MAX_HEARTBEAT_INTERVAL_S


def test_an_interval_in_range_is_kept():
    assert heartbeat_interval(0.5) == 0.5
    assert heartbeat_interval(2) == 2.0


@pytest.mark.parametrize("sent", [math.inf, 1e300])
def test_a_worker_told_an_enormous_interval_keeps_serving_and_stops_when_asked(sent):
    played = PlayedScheduler(heartbeat_s=sent)
    try:
        played.batch(1, steps=2)
        played.next({protocol.Kind.BATCH_RESULT})  # the I/O thread forwarded it: it is alive
        assert played.thread.is_alive() and played.served is None
    finally:
        played.close()  # stop() is read at the next poll tick, however long the interval
    assert not played.thread.is_alive()
    assert played.served is None


def test_the_poll_tick_is_finite_whatever_the_interval():
    worker = Worker("tcp://127.0.0.1:1", NullAdapter(4), worker_id="w", warmup_shapes=[])
    try:
        worker.heartbeat_interval_s = heartbeat_interval(math.inf)
        assert 0 < worker._poll_ms() <= 250
    finally:
        worker.ctx.term()
