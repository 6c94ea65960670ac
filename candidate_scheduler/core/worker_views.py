"""The workers' planning views, kept between snapshots: only the stale ones are rebuilt.

Every planning decision reads the workers through a snapshot (core/snapshot.py), and a burst of
submissions with deadlines takes one snapshot per submission. Between two of them the workers rarely
change, so rebuilding all K views -- or even looking at each to see whether it changed -- made every
decision O(workers). A worker says when its view goes stale (`WorkerState.stale`: it took or gave back
work, or its predicted ends moved); this keeps the views in the engine's order of workers and rebuilds
only those, and hands out the same tuple until one changes, so that answers derived from the tuple can
be kept by its identity (core/fluid.py). A worker that comes or goes, or whose rows change, moves the
engine's rows epoch (`Engine.rows_changed`): then every view is rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping

from candidate_scheduler.core.snapshot import WorkerView


class WorkerViews:
    def __init__(self) -> None:
        self._views: list[WorkerView] = []  # in the order of the engine's workers
        self._at: dict[str, int] = {}  # worker id -> its position in _views
        self._tuple: tuple[WorkerView, ...] = ()
        self._epoch: int | None = None  # the rows epoch the views were built in
        self._stale: set[str] = set()

    def stale(self, worker_id: str) -> None:
        """`worker_id`'s view no longer holds (WorkerState.on_stale)."""
        self._stale.add(worker_id)

    def current(self, workers: Mapping, epoch: int, prefetch: int) -> tuple[WorkerView, ...]:
        """Every worker's view, in `workers`' order, each worker running `w.rows` rows at once."""
        if epoch != self._epoch:
            self._views = [self._build(w, prefetch) for w in workers.values()]
            self._at = {wid: i for i, wid in enumerate(workers)}
            self._epoch = epoch
        elif self._stale:
            for wid in self._stale:
                i = self._at.get(wid)
                if i is not None:  # one that left since is gone from the views with the epoch
                    self._views[i] = self._build(workers[wid], prefetch)
        else:
            return self._tuple
        self._stale.clear()
        self._tuple = tuple(self._views)
        return self._tuple

    @staticmethod
    def _build(w, prefetch: int) -> WorkerView:
        return WorkerView.of(w, w.rows, prefetch)
