"""Conditioning off the step loop: groups that join a busy worker are prepared on their own thread.

A group's `start` (sglang's preprocessing, the VAE encode of a fresh observation, the text pathway)
costs about as much as four or five denoise steps at small shapes, and on the compute thread it
stalls every group already running: none of them steps until the joiner is ready. On CPU the bf16
VAE encode runs on one core (torch's slow_conv3d fallback has no bf16 threading), so the compute
thread's steps and a joiner's encode side by side take little more wall time than either alone
(bench/README.md, "Conditioning off the step loop").

`Preparer` runs `adapter.start` for every group it is given, one at a time and in order, on one
thread, and hands each started group (or the exception its start raised) to `deliver`, which the
worker points at its compute thread's inbox; the compute thread admits it at the next step boundary
(running.py, which gives it only the groups that arrive while others run). Only an adapter that declares `concurrent_start = True` is driven this way: its
`start` may run while its `step`, `finish` and `release` run on the compute thread.

On CUDA the two threads issue to the same default stream, so GPU work stays in one order; what
overlaps there is the host side of the join (preprocessing, tokenization, kernel launches).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from candidate_scheduler.core.work import GroupWork

log = logging.getLogger("candidate_scheduler.worker")


@dataclass
class Prepared:
    """What came back for one group of one assignment: the started group, or why it could not start."""

    batch_id: int
    index: int
    group: Any = None
    error: BaseException | None = None


def supports_concurrent_start(adapter: Any) -> bool:
    return bool(getattr(adapter, "concurrent_start", False))


class Preparer:
    def __init__(self, start: Callable[[GroupWork], Any], deliver: Callable[[Prepared], None]):
        self._start = start
        self._deliver = deliver
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="conditioning", daemon=True)
        self._thread.start()

    def submit(self, batch_id: int, index: int, item: GroupWork) -> None:
        self._queue.put((batch_id, index, item))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop after the group being prepared now; groups still queued are never started."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None or self._closed:
                return
            batch_id, index, item = job
            try:
                result = Prepared(batch_id, index, group=self._start(item))
            except Exception as exc:  # noqa: BLE001 - the compute thread answers the group with it
                result = Prepared(batch_id, index, error=exc)
            self._deliver(result)
