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

Two starts never run at once, whatever the adapter: the compute thread starts a group itself when
nothing runs (running.py), and that may be while one is still under way here (the groups that ran left
meanwhile); it starts through `Preparer.start`, which waits for that one.

A queued start whose group nobody waits for any more (its assignment given back, the group cancelled,
the worker told to register again) is `forget`-ten: it never runs, so a leaving worker's grace is not
spent conditioning work that runs elsewhere. Nothing waits for its delivery: the running batch forgets
only a group it has already let go of. A start already running when it is forgotten runs to its end
and is delivered; the running batch releases what it made.

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
    # which arrival of `batch_id` it is for: a scheduler that restarted numbers its assignments afresh, so
    # a start delivered late must not be taken for a group of a new assignment with the same id
    token: int = 0


def supports_concurrent_start(adapter: Any) -> bool:
    return bool(getattr(adapter, "concurrent_start", False))


class Preparer:
    def __init__(self, start: Callable[[GroupWork], Any], deliver: Callable[[Prepared], None]):
        self._start = start
        self._deliver = deliver
        self._queue: queue.Queue = queue.Queue()  # job keys, in submission order
        self._jobs: dict[tuple[int, int, int], GroupWork] = {}  # queued, not started: forgetting one drops it
        self._jobs_lock = threading.Lock()
        self._starting = threading.Lock()  # one start at a time, this thread's and the compute thread's
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="conditioning", daemon=True)
        self._thread.start()

    def submit(self, batch_id: int, index: int, item: GroupWork, token: int = 0) -> None:
        key = (batch_id, index, token)
        with self._jobs_lock:
            self._jobs[key] = item
        self._queue.put(key)

    def start(self, item: GroupWork) -> Any:
        """Start a group on the calling thread, once no other start runs."""
        with self._starting:
            return self._start(item)

    def forget(self, batch_id: int, index: int, token: int = 0) -> bool:
        """Do not start this group if it has not started yet; True: it never will (no delivery comes)."""
        with self._jobs_lock:
            return self._jobs.pop((batch_id, index, token), None) is not None

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop after the group being prepared now; groups still queued are never started."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            key = self._queue.get()
            if key is None or self._closed:
                return
            with self._jobs_lock:
                item = self._jobs.pop(key, None)
            if item is None:  # forgotten while it queued
                continue
            batch_id, index, token = key
            try:
                result = Prepared(batch_id, index, group=self.start(item), token=token)
            except BaseException as exc:  # noqa: BLE001 - the compute thread answers the group with it
                # BaseException too (a library's SystemExit): this thread ending would leave the group, and every
                # later one, waiting for a delivery that never comes, while the worker beats on, listing them
                result = Prepared(batch_id, index, error=exc, token=token)
            self._deliver(result)
