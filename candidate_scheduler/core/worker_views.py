"""The workers' planning views, kept between snapshots: only the stale ones are rebuilt.

Every planning decision reads the workers through a snapshot (core/snapshot.py), and a burst of
submissions with deadlines takes one snapshot per submission. Between two of them the workers rarely
change, so rebuilding all K views -- or even looking at each to see whether it changed -- made every
decision O(workers). A worker says when its view goes stale (`WorkerState.stale`: it took or gave back
work, or its predicted ends moved); this keeps the views in the engine's order of workers and rebuilds
only those, and hands out the same tuple until one changes, so that answers derived from the tuple can
be kept by its identity (core/fluid.py). A worker that comes or goes, or whose rows change, moves the
engine's rows epoch (`Engine.rows_changed`): then every view is rebuilt.

It also keeps which workers are *open* (`WorkerState.open_to_work`): they may be sent work now or once
they are due for it. A planning pass looks at those alone, so under load (every worker full) its cost
follows the few that just freed rows, not the fleet; and whether any is open is answered from the
workers themselves, without building a view a pass would not read.
"""

from __future__ import annotations

from collections.abc import Mapping

from candidate_scheduler.core.change_log import ChangeLog
from candidate_scheduler.core.snapshot import WorkerView


class WorkerViews:
    def __init__(self, batching: str) -> None:
        self._dispatch = batching == "dispatch"
        self._views: list[WorkerView] = []  # in the order of the engine's workers
        self._at: dict[str, int] = {}  # worker id -> its position in _views (replaced, never changed, per epoch)
        self._tuple: tuple[WorkerView, ...] = ()
        self._epoch: int | None = None  # the rows epoch the views were built in
        self._stale: set[str] = set()  # views to rebuild
        self._unsettled: set[str] = set()  # workers whose openness to ask again
        self._open: set[str] = set()
        self._open_tuple: tuple[WorkerView, ...] | None = ()  # None: to sort again when next asked
        # The positions whose view was rebuilt, in order; restarted when every view is (core/fleet_terms.py)
        self.changes: ChangeLog[int] = ChangeLog()

    def stale(self, worker_id: str) -> None:
        """`worker_id`'s view no longer holds (WorkerState.on_stale)."""
        self._stale.add(worker_id)
        self._unsettled.add(worker_id)

    def any_open(self, workers: Mapping, epoch: int, prefetch: int) -> bool:
        """Whether some worker may be sent work (see the module docstring)."""
        if epoch != self._epoch:
            self.current(workers, epoch, prefetch)
        else:
            self._settle(workers, prefetch)
        return bool(self._open)

    def current(self, workers: Mapping, epoch: int, prefetch: int) -> tuple[WorkerView, ...]:
        """Every worker's view, in `workers`' order, each worker running `w.rows` rows at once."""
        if epoch != self._epoch:
            self._views = [WorkerView.of(w, w.rows, prefetch) for w in workers.values()]
            self._at = {wid: i for i, wid in enumerate(workers)}
            self._open = {wid for wid, w in workers.items() if w.open_to_work(prefetch, self._dispatch)}
            self._epoch = epoch
            self.changes.restart()
        elif self._stale:
            for wid in self._stale:
                i = self._at.get(wid)
                if i is not None:  # one that left since is gone from the views with the epoch
                    self._views[i] = WorkerView.of(workers[wid], workers[wid].rows, prefetch)
                    self.changes.append(i)
            self._settle(workers, prefetch)
        else:
            return self._tuple
        self._stale.clear()
        self._unsettled.clear()
        self._tuple = tuple(self._views)
        self._open_tuple = None
        return self._tuple

    def open(self) -> tuple[WorkerView, ...]:
        """The open workers' views, in the workers' order, as of `current` (so, like a snapshot, valid until
        a worker changes). Sorted when asked, not at each change: under late prefetch nearly every worker
        is open, and a pass that reads the due orders (core/snapshot.py) never asks."""
        if self._open_tuple is None:
            self._open_tuple = tuple(self._views[i] for i in sorted(self._at[wid] for wid in self._open))
        return self._open_tuple

    @property
    def positions(self) -> Mapping[str, int]:
        """Worker id -> its place in the tuple `current` returns (the same mapping until the epoch moves)."""
        return self._at

    def _settle(self, workers: Mapping, prefetch: int) -> None:
        for wid in self._unsettled:
            w = workers.get(wid)
            if w is not None and wid in self._at and w.open_to_work(prefetch, self._dispatch):
                self._open.add(wid)
            else:
                self._open.discard(wid)
        self._unsettled.clear()
