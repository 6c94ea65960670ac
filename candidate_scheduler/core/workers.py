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
    run_s: float = 0.0  # of predicted_s, what it takes once it starts (less its wait behind the work before it)
    # When it is predicted to be done, for planning: sent_at + predicted_s, until the work before it
    # ends and it starts (WorkerLink.reanchor) -- then its start plus run_s, so one batch's error in the
    # prediction is not carried into every later one's
    ends_at: float = 0.0
    cost_rows: int = 0  # rows its forwards carry (candidates x observations)
    seen_at: float | None = None  # last heartbeat that listed it
    cancelled: set[str] = field(default_factory=set)
    rows: int = field(init=False)  # candidate rows it holds
    # Its planning view (snapshot.RunningWork), kept while its predicted end holds: a step-batching
    # worker holds a dozen assignments, and rebuilding all their views after every result cost ~60 us
    view: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rows = sum(len(e.candidate_ids) for e in self.entries)
        self.ends_at = self.ends_at or self.sent_at + self.predicted_s


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
    oom_rows: int = 0  # the rows of the forward that ran out of memory in its last incident
    rows_in_use: int = 0  # the rows of its assignments (kept by hold and release)
    rows: int = 0  # the rows it may hold: capacity capped by predicted memory (the engine keeps it)
    registered_rows: int = 0  # the rows it registered with: it runs that many unless told fewer
    oom_key: Any = None  # the last out-of-memory incident (see worker_link._out_of_memory)
    oom_since: int = 0  # the first assignment id sent after it: those are not part of it
    # forward labels one candidate of which ran it out of memory: none is sent to it again while it lives
    # (core/fleet_rows.py), where other workers may hold them; its capacity stays for every other shape
    refused_labels: frozenset[str] = frozenset()
    said_leaving: bool = False  # it said LEAVING (an operator's leave is asked again until it does)
    registration: Any = field(default=None, repr=False, compare=False)  # the REGISTER it came with, as read
    # told the worker's id when its view goes stale: the engine rebuilds only those views (Engine.snapshot)
    on_stale: Any = field(default=None, repr=False, compare=False)

    def stale(self) -> None:
        """What it holds, or when that is predicted to end, changed: its view is rebuilt at the next snapshot."""
        if self.on_stale is not None:
            self.on_stale(self.worker_id)

    def hold(self, a: Assignment) -> None:
        self.assignments[a.batch_id] = a
        self.rows_in_use += a.rows
        self.stale()

    def release(self, batch_id: int) -> Assignment | None:
        a = self.assignments.pop(batch_id, None)
        if a is not None:
            self.rows_in_use -= a.rows
            self.stale()
        return a

    @property
    def idle(self) -> bool:
        return not self.assignments

    def open_to_work(self, prefetch: int, dispatch: bool) -> bool:
        """It may be sent work now or once due for it: under dispatch batching it may take a batch (it holds
        no more than it may prefetch), under step batching it has free or spare rows. Asked of the worker,
        not its view (core/snapshot.WorkerView.open_to_work), so that the answer needs no view built."""
        if dispatch:
            return len(self.assignments) <= prefetch
        return self.rows * (1 + prefetch) > self.rows_in_use

    @property
    def forward_key(self) -> tuple | None:
        """The forward key of the rows it runs now (None when idle): a join must match it."""
        for a in self.assignments.values():
            return a.forward_key
        return None
