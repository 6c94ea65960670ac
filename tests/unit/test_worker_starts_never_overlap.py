"""The worker never runs two `adapter.start` calls at once (worker/preparing.py, worker/running.py).

An adapter declaring `concurrent_start` promises that its start may run beside its step, finish and
release -- not beside another start. Yet a start under way on the conditioning thread (a joiner started
while others ran) could be overlapped by one on the compute thread: once the running groups left (done,
cancelled), the next assignment admitted with nothing running was started there at once. Only Cosmos3's
own `_start_lock` kept that safe.
"""

from __future__ import annotations

import queue
import threading

from candidate_scheduler.worker.preparing import Preparer
from candidate_scheduler.worker.running import RunningBatch
from tests.unit.test_preparing import HeldAdapter, _assignment, _running


class CountingAdapter(HeldAdapter):
    """Keeps the most starts that ran at one time."""

    def __init__(self):
        super().__init__()
        self._count_lock = threading.Lock()
        self.now = 0
        self.most = 0

    def start(self, item):
        with self._count_lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().start(item)
        finally:
            with self._count_lock:
                self.now -= 1


def test_a_start_on_the_compute_thread_waits_for_the_one_under_way_on_the_conditioning_thread():
    adapter = CountingAdapter()
    inbox: queue.Queue = queue.Queue()
    preparer = Preparer(adapter.start, inbox.put)
    batch = RunningBatch(adapter, preparer=preparer)
    try:
        batch.admit(_assignment(99, "long", steps=50), 0.0)  # nothing ran: started here
        gate = adapter.hold("slow")
        batch.admit(_assignment(1, "slow"), 0.0)  # beside "long": started on the conditioning thread
        adapter.under_way("slow")
        batch.drop({99: {"long"}})  # nothing runs now; "slow" is still being started

        # the compute thread's next admission, on a thread of its own so that the test can let "slow" go
        compute = threading.Thread(target=batch.admit, args=(_assignment(2, "next"),  0.0), daemon=True)
        compute.start()
        compute.join(0.2)  # with the bug it starts "next" at once, beside "slow"
        gate.set()
        compute.join(10)
        assert not compute.is_alive()
        batch.prepared(inbox.get(timeout=10))
        assert adapter.most == 1
        assert set(_running(batch)) == {"slow", "next"}
    finally:
        preparer.close()
