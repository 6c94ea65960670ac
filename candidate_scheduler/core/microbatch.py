"""Planning physical batches from admitted groups, keeping candidate identity.

The planning rule (queue order with group atomicity, backfill behind the head):

1. The queue is in the engine's order (earliest effective deadline first; receipt order without
   deadlines); each group's pending slices are taken in slice order. Call each (group, slice) a unit. A slice is never split: admission sized slices to fit a batch.
2. A batch starts with the earliest unplanned unit -- the head of line -- whatever its size, so the
   head always goes into the next batch and a large group is never overtaken indefinitely.
3. Behind the head, the batch is filled first-fit, in queue order, with later units of the SAME
   `BatchKey` that still fit the remaining capacity. Units of other keys are skipped, not reordered:
   each becomes a head in a later batch. Consequence (tested): the k-th unit in queue order is in one of
   the first k batches, and batches are ordered by their heads' queue positions.
4. Inside a batch, entries keep queue order (groups as queued, slices ascending), and each
   entry's candidates are ascending, so a group's rows have the same relative order whatever shares
   the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.values import value


@value
class BatchKey:
    """Groups may share one physical batch only if every field matches."""

    model: str
    height: int
    width: int
    steps: int
    guidance: float
    action_mode: str
    horizon: int
    prompt_tokens: int  # tokenized prompt length: batched prompts must tokenize to equal length


@value
class QueuedGroup:
    """A group waiting for work, as the planner sees it: its pending (slice index, candidate ids)."""

    request_id: str
    key: BatchKey
    pending: tuple[tuple[int, tuple[int, ...]], ...]


@value
class BatchEntry:
    request_id: str
    slice_index: int
    candidate_ids: tuple[int, ...]


@value
class PhysicalBatch:
    key: BatchKey
    entries: tuple[BatchEntry, ...]

    @property
    def size(self) -> int:
        return sum(len(e.candidate_ids) for e in self.entries)

    def rows(self) -> list[tuple[str, int]]:
        """(request_id, candidate_id) of every batch row, in row order."""
        return [(e.request_id, cid) for e in self.entries for cid in e.candidate_ids]

    def split(self, outputs: Sequence[Any], rows: Sequence[tuple[str, int]] | None = None) -> list[tuple[BatchEntry, Any]]:
        """Cut batch outputs (an array [B, ...] or a list of B items, in row order) back into one
        piece per entry. With `rows` (the identities a worker echoed back), they must equal `rows()`
        exactly -- results are matched by identity, never assumed by position alone."""
        if len(outputs) != self.size:
            raise CandidateContractError("outputs", "shape_mismatch", f"batch has {self.size} rows", len(outputs))
        if rows is not None and [tuple(r) for r in rows] != self.rows():
            raise CandidateContractError("rows", "candidate_mismatch", "rows differ from the batch's rows", list(rows)[:8])
        pieces, start = [], 0
        for entry in self.entries:
            end = start + len(entry.candidate_ids)
            pieces.append((entry, outputs[start:end]))
            start = end
        return pieces


def _as_group(item: Any) -> QueuedGroup:
    if isinstance(item, QueuedGroup):
        return item
    request_id, key, pending = item
    return QueuedGroup(request_id, key, tuple((int(i), tuple(ids)) for i, ids in pending))


def plan_batches(
    queue: Iterable[QueuedGroup | tuple[str, BatchKey, Sequence[tuple[int, Sequence[int]]]]],
    capacity: int,
    *,
    max_batches: int | None = None,
) -> list[PhysicalBatch]:
    """Plan physical batches of at most `capacity` candidates (see the module docstring for the rule).

    `queue` is in the engine's order; items are `QueuedGroup`s or (request_id, key, pending) tuples
    where pending is ((slice_index, candidate_ids), ...), as `GroupState.pending_slices()` returns.
    A slice larger than `capacity` is an error (it would have to be split). `max_batches` stops
    planning early (e.g. one batch for the one idle worker).
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise CandidateContractError("capacity", "invalid_value", "must be an int >= 1", capacity)
    units: list[tuple[BatchKey, BatchEntry]] = []
    seen: set[str] = set()
    for item in queue:
        group = _as_group(item)
        if group.request_id in seen:
            raise CandidateContractError("request_id", "duplicate_candidate", "group queued twice", group.request_id)
        seen.add(group.request_id)
        for slice_index, ids in sorted(group.pending):
            if not ids or any(a >= b for a, b in zip(ids, ids[1:])):
                raise CandidateContractError("candidate_ids", "invalid_value", "must be non-empty, sorted, unique", ids)
            if len(ids) > capacity:
                raise CandidateContractError(
                    "capacity", "does_not_fit",
                    f"slice {slice_index} of {group.request_id!r} has {len(ids)} candidates", capacity,
                )
            units.append((group.key, BatchEntry(group.request_id, slice_index, tuple(ids))))

    batches: list[PhysicalBatch] = []
    taken = [False] * len(units)
    head = 0
    while head < len(units) and (max_batches is None or len(batches) < max_batches):
        key, first = units[head]
        entries, used = [first], len(first.candidate_ids)
        taken[head] = True
        for j in range(head + 1, len(units)):
            if used == capacity:
                break
            other_key, entry = units[j]
            if not taken[j] and other_key == key and used + len(entry.candidate_ids) <= capacity:
                entries.append(entry)
                used += len(entry.candidate_ids)
                taken[j] = True
        batches.append(PhysicalBatch(key, tuple(entries)))
        while head < len(units) and taken[head]:
            head += 1
    return batches
