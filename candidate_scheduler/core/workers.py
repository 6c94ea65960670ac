"""The engine's view of its workers and of the work each one holds.

A worker holds *assignments*: one per BATCH or JOIN message the engine sent it, each a tuple of
`BatchEntry` (a slice of a group). Under dispatch-level batching a worker holds at most one assignment at
a time; under step-level batching it holds as many as fit its rows, all in one running batch. An
assignment is answered by exactly one worker result with the same id; anything else is late.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from candidate_scheduler.core.microbatch import BatchEntry
from candidate_scheduler.core.spec import ModelCapability


@dataclass
class Assignment:
    batch_id: int
    worker_id: str
    entries: tuple[BatchEntry, ...]
    forward_key: tuple  # the SamplingSpec.forward_key of its groups (one key per assignment)
    sent_at: float
    join: bool = False
    label: str = ""  # the forward label of its groups (cost model key)
    predicted_s: float = 0.0  # what the cost model predicted for it when it was sent
    steps: int = 0  # denoise steps it runs (the longest of its slices)
    cost_rows: int = 0  # rows its forwards carry (candidates x observations)
    seen_at: float | None = None  # last heartbeat that listed it
    cancelled: set[str] = field(default_factory=set)

    @property
    def rows(self) -> int:
        return sum(len(e.candidate_ids) for e in self.entries)


@dataclass
class WorkerState:
    worker_id: str
    identity: Any
    capability: ModelCapability
    capacity: int  # candidate rows at once (lowered when the worker runs out of memory)
    device: str
    last_seen: float
    memory_budget_bytes: int = 0  # 0: unknown, rows are not capped by predicted memory
    # it conditions groups that join on their own thread: the groups it runs step on meanwhile
    conditions_aside: bool = False
    step: int | None = None
    assignments: dict[int, Assignment] = field(default_factory=dict)

    @property
    def rows_in_use(self) -> int:
        return sum(a.rows for a in self.assignments.values())

    @property
    def idle(self) -> bool:
        return not self.assignments

    @property
    def forward_key(self) -> tuple | None:
        """The forward key of the rows it runs now (None when idle): a join must match it."""
        for a in self.assignments.values():
            return a.forward_key
        return None
