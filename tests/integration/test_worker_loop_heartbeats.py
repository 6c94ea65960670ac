"""What a worker's heartbeats carry about its conditioning cache (worker/loop.py, `_cache_delta`), against
a scheduler the test plays: counter increments that add up to the adapter's counters, whatever the link
did, and an adapter whose counters cannot be read costs the counters, not the worker."""

from __future__ import annotations

import threading
import time

import zmq

from candidate_scheduler import protocol
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.conftest import wait_for
from tests.integration.played_scheduler import PlayedScheduler


class Counting(NullAdapter):
    """A cache whose misses the test raises at will; `broken` makes reading them raise."""

    def __init__(self, rows: int = 4):
        super().__init__(rows)
        self.misses = 0
        self.broken = False
        self._lock = threading.Lock()

    def cache_stats(self) -> dict:
        if self.broken:
            raise RuntimeError("the cache's counters could not be read")
        with self._lock:
            return {"text_misses": self.misses, "bytes": 0}


def test_an_adapter_whose_cache_counters_raise_still_heartbeats_and_serves():
    adapter = Counting()
    p = PlayedScheduler(0.01, adapter=adapter, heartbeat_s=0.05)
    try:
        adapter.broken = True
        p.batch(1, 5)
        p.next({protocol.Kind.BATCH_RESULT})
        assert [o.status for o in p.outputs[1]] == ["ok"]
        p.next({protocol.Kind.HEARTBEAT})  # and again after the answer
        assert p.served is None and p.thread.is_alive()
        adapter.broken = False
        adapter.misses = 3
        while p.next({protocol.Kind.HEARTBEAT})[2].cache.get("text_misses") != 3:
            pass
    finally:
        p.close()


def test_cache_counts_in_heartbeats_the_link_could_not_take_are_sent_with_a_later_one():
    adapter = Counting()
    p = PlayedScheduler(adapter=adapter, heartbeat_s=0.05, sndhwm=5)
    back = None
    try:
        p.next({protocol.Kind.HEARTBEAT})
        p.sock.close(0)  # the scheduler is away: 5 heartbeats queue, the rest are dropped
        time.sleep(0.3)  # what was on its way when it went is lost with the connection: no misses in it
        for _ in range(20):
            adapter.misses += 1
            time.sleep(0.05)
        back = p.ctx.socket(zmq.ROUTER)
        back.setsockopt(zmq.LINGER, 0)
        back.bind(f"tcp://127.0.0.1:{p.port}")
        p.sock = back
        p.beats.clear()
        wait_for(lambda: p.next({protocol.Kind.HEARTBEAT}) and
                 sum(b.cache.get("text_misses", 0) for b in p.beats) == 20, 10, "every miss counted once")
        time.sleep(0.3)
        p.next({protocol.Kind.HEARTBEAT})
        assert sum(b.cache.get("text_misses", 0) for b in p.beats) == 20
    finally:
        p.close()
