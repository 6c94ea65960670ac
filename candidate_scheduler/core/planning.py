"""Which queued slices go to which worker, under both batching modes.

A *unit* is one pending slice of one admitted group; units are in queue order (groups earliest
effective deadline first, core/deadlines.order: receipt order among groups without one; slices ascending). Admission sized every slice to fit the smallest live worker, so a unit is
never split here.

Dispatch-level batching (`plan_dispatch`): only idle workers get work. Each idle worker, largest
first, gets one physical batch planned by `microbatch.plan_batches` (the head of line always goes into
the next batch; compatible later units backfill behind it). The batch runs from its first step to its
last before that worker gets more.

Step-level batching (`plan_step`): a worker takes units while it has free rows; a unit joins the
worker's running batch at its next step boundary. The rule:

1. Units are placed in queue order. A unit may go to a worker with enough free rows whose running rows
   have the same forward key (shape, CFG on/off), or to an idle worker.
2. Among those, the worker with the fewest free rows that still fit wins (best fit: rows are packed
   into shared forwards, and whole workers stay free for large groups).
3. A unit that no worker can take now is *blocked*. It reserves one worker that could ever hold it
   (capacity >= its size), the one with the most free rows. A reserved worker takes no later unit, so
   it drains until the blocked unit fits. Reservations are derived from the queue afresh every time
   planning runs, so while the head of the queue stays blocked it keeps its reservation: a large group
   at the head is never starved by a stream of small groups joining ahead of it, and small groups still
   flow to the workers nobody reserved.
4. Backfill (EASY backfilling, with the cost model): a later unit may still join a reserved worker when
   the engine's `backfill(worker, head, unit)` says it will be done before the worker would have freed
   enough rows for the head anyway -- it uses rows that would idle. That is a forecast (with the
   measured safety margin), checked against the worker as it runs now: several backfills in one
   planning pass are each checked alone, so the head can be delayed by as much as the forecast errs.
   Without a calibrated cost model the engine gives no backfill, and rule 3 holds as stated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from candidate_scheduler.core.microbatch import BatchEntry, BatchKey, PhysicalBatch, QueuedGroup, plan_batches


@dataclass(frozen=True)
class Unit:
    request_id: str
    slice_index: int
    candidate_ids: tuple[int, ...]
    batch_key: BatchKey | tuple
    forward_key: tuple

    @property
    def size(self) -> int:
        return len(self.candidate_ids)

    @property
    def entry(self) -> BatchEntry:
        return BatchEntry(self.request_id, self.slice_index, self.candidate_ids)


@dataclass
class WorkerSlot:
    """What planning needs to know of a worker; `free_rows` and `forward_key` change as it plans."""

    worker_id: str
    capacity: int
    free_rows: int
    forward_key: tuple | None  # of its running rows; None when idle

    def accepts(self, unit: Unit) -> bool:
        return self.free_rows >= unit.size and self.forward_key in (None, unit.forward_key)


def plan_dispatch(units: list[Unit], idle: list[WorkerSlot]) -> list[tuple[str, PhysicalBatch]]:
    """One physical batch for each idle worker that has work, largest worker first."""
    plans: list[tuple[str, PhysicalBatch]] = []
    remaining = list(units)
    for worker in sorted(idle, key=lambda w: -w.capacity):
        queued: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        keys: dict[str, tuple] = {}
        for u in remaining:
            if u.size <= worker.capacity:
                queued.setdefault(u.request_id, []).append((u.slice_index, u.candidate_ids))
                keys[u.request_id] = u.batch_key
        if not queued:
            break
        batch = plan_batches([QueuedGroup(rid, keys[rid], tuple(p)) for rid, p in queued.items()], worker.capacity,
                             max_batches=1)
        if not batch:
            break
        plans.append((worker.worker_id, batch[0]))
        taken = {(e.request_id, e.slice_index) for e in batch[0].entries}
        remaining = [u for u in remaining if (u.request_id, u.slice_index) not in taken]
    return plans


def plan_step(units: list[Unit], workers: list[WorkerSlot],
              backfill: Callable[[str, Unit, Unit], bool] | None = None) -> list[tuple[str, Unit]]:
    """(worker id, unit) placements, in queue order (see the module docstring for the rule)."""
    placements: list[tuple[str, Unit]] = []
    reserved: dict[str, Unit] = {}  # worker id -> the blocked unit it is kept for
    for unit in units:
        open_ = [w for w in workers if w.accepts(unit) and (
            w.worker_id not in reserved
            or (backfill is not None and backfill(w.worker_id, reserved[w.worker_id], unit)))]
        if open_:
            best = min(open_, key=lambda w: (w.free_rows, w.forward_key is None))
            best.free_rows -= unit.size
            best.forward_key = unit.forward_key
            placements.append((best.worker_id, unit))
            continue
        holders = [w for w in workers if w.worker_id not in reserved and w.capacity >= unit.size]
        if holders:
            reserved[max(holders, key=lambda w: w.free_rows).worker_id] = unit
        if len(reserved) == len(workers) and backfill is None:
            break
    return placements
