"""A worker's running batch: the assignments it holds, advanced one denoise step at a time.

The compute thread owns one `RunningBatch`. Each assignment (one BATCH or JOIN from the scheduler)
brings groups, decoded on the IO thread (`arrival`); each group is a *slot* with one explicit state and
one transition method (`Slot.to`, checked against `ALLOWED`, as core/group_state.py does for groups):

    QUEUED -> PREPARING -> READY -> RUNNING -> DONE        (CANCELLED from any live state;
          \\_________________/^                              UNREADABLE: it never decoded;
                                                           PREPARING -> QUEUED: see `prepared`)

Admission follows arrival order and the worker's rows. An assignment is admitted when its rows fit
beside the rows admitted before it, and a BATCH only once nothing runs (a dispatch batch runs from its
first step to its last on its own); nothing overtakes an assignment that waits. So the scheduler may
send a worker its next assignment before the current one ends -- it waits here, not on the network, and
starts at the first step boundary with room, never a round trip later.

Admitted groups are started (conditioning, noise, their own solvers) on the compute thread when
nothing runs, and on the conditioning thread (`Preparer`, preparing.py) when others run, so those keep
stepping: a compute thread that waited idle for the conditioning thread ran its first step 5-10 ms
slower at 64x64 on these CPUs (bench/README.md, "Conditioning off the step loop"). An assignment's groups
join together, at the first boundary after the last of them is ready, and assignments join in arrival
order: the groups of one BATCH (and the slices of one JOIN) stay in lockstep and can share solver steps.
Every step advances all running groups (`step`: the adapter shares forwards between the groups that can
share them); a group that is done leaves at once and frees its rows, and an assignment whose groups all
have an output is handed back (`take_done`) to be answered with one BATCH_RESULT. Cancelled groups
leave at the next boundary (`drop`).

`adapter.release` runs only on the ways out of a group (cancelled, given back, a failed forward, a start
nobody waits for), where its failure must not stop the rest: it is logged, and the worker goes on
(`_release`). `abandon` lets go of everything at once: the worker's compute thread failed (it answers
what it held with `worker_error`, and the scheduler retries it), or the scheduler forgot the worker.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import BatchReport, GroupOutput, GroupWork
from candidate_scheduler.worker import stepping
from candidate_scheduler.worker.preparing import Prepared, Preparer

log = logging.getLogger("candidate_scheduler.worker")


class SlotState(enum.IntEnum):
    QUEUED = 0  # decoded; its assignment waits for rows
    PREPARING = 1  # being started on the conditioning thread
    READY = 2  # started; waits for the rest of its assignment (and the assignments before it) to join
    RUNNING = 3  # in the running batch
    # Terminal region: it has its output.
    DONE = 4  # finished, or failed to start, step or finish (the output says which)
    CANCELLED = 5
    UNREADABLE = 6  # the group could not be decoded


_LIVE = (SlotState.QUEUED, SlotState.PREPARING, SlotState.READY, SlotState.RUNNING)
ALLOWED = {
    SlotState.QUEUED: {SlotState.PREPARING, SlotState.READY, SlotState.DONE, SlotState.CANCELLED},
    SlotState.PREPARING: {SlotState.QUEUED, SlotState.READY, SlotState.DONE, SlotState.CANCELLED},
    SlotState.READY: {SlotState.RUNNING, SlotState.CANCELLED},
    SlotState.RUNNING: {SlotState.DONE, SlotState.CANCELLED},
    SlotState.DONE: set(),
    SlotState.CANCELLED: set(),
    SlotState.UNREADABLE: set(),
}


_tokens = itertools.count(1)  # one per arrival: see `Prepared.token`


class IllegalSlotTransition(RuntimeError):
    """A slot state change `ALLOWED` does not have: a worker bug."""


@dataclass
class Slot:
    index: int
    request_id: str
    item: GroupWork | None  # None: unreadable
    state: SlotState
    group: Any = None  # the adapter's running group once started (stepping.RunningGroup)
    output: GroupOutput | None = None
    # its start was submitted before its assignment was admitted (beside others' rows): what it runs into
    # says nothing about its own rows, even when they free while the start is under way
    early: bool = False

    @property
    def rows(self) -> int:
        """Candidate rows, as the scheduler counts a worker's capacity."""
        return 0 if self.item is None else len(self.item.candidates)

    @property
    def finished(self) -> bool:
        return self.state >= SlotState.DONE

    def to(self, state: SlotState, *, group: Any = None, output: GroupOutput | None = None) -> None:
        if state not in ALLOWED[self.state]:
            raise IllegalSlotTransition(f"group {self.request_id!r}: {self.state.name} -> {state.name}")
        self.state = state
        if group is not None:
            self.group = group
        if output is not None:
            self.output = output
        if state >= SlotState.DONE:
            self.group = None


@dataclass(frozen=True)
class Arrival:
    """An assignment as the IO thread decoded it: each group's work, or why it could not be read."""

    batch_id: int
    batch: bool  # True: a BATCH (runs on its own); False: a JOIN of the running batch
    items: tuple[GroupWork | GroupOutput, ...]  # a GroupOutput: the group could not be decoded
    received_at: float  # perf_counter() when the IO thread read it
    rows: int = 0  # the rows the scheduler lets it run at once now (0: its own capacity)


def arrival_from_wire(msg: protocol.BatchMsg, kind: protocol.Kind, received_at: float) -> Arrival:
    """Decode an assignment (on the IO thread); a group that cannot be read is answered bad_request."""
    items: list[GroupWork | GroupOutput] = []
    for g in msg.groups:
        try:
            items.append(convert.work_from_wire(g))
        except (ValueError, TypeError) as exc:  # ProtocolError is a ValueError
            items.append(GroupOutput(g.request_id, "error", error=str(exc), error_code="bad_request"))
    return Arrival(msg.batch_id, kind is protocol.Kind.BATCH, tuple(items), received_at, msg.rows)


@dataclass
class Assignment:
    batch_id: int
    batch: bool
    received_at: float  # perf_counter() when the IO thread read it
    slots: list[Slot]
    report: BatchReport = field(default_factory=BatchReport)
    admitted: bool = False
    early: bool = True  # may be conditioned before it is admitted (not after that ran out of memory)
    joined: bool = False
    first_step_at: float | None = None
    steps_at_receipt: int = 0  # the running batch's step count when it arrived
    steps_while_conditioned: int = 0  # steps the running batch took between its arrival and its join
    # a forward it shared ran out of memory: the rows that forward carried and the step (the scheduler
    # blames those rows, once for every assignment that shared the step)
    out_of_memory: tuple[int, int] | None = None
    token: int = field(default_factory=lambda: next(_tokens))

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slots if not s.finished)

    @property
    def complete(self) -> bool:
        return all(s.finished for s in self.slots)

    @property
    def items(self) -> list[GroupWork | None]:
        return [s.item for s in self.slots]

    @property
    def outputs(self) -> dict[int, GroupOutput]:
        return {s.index: s.output for s in self.slots if s.finished}

    @property
    def running(self) -> dict[int, Any]:
        return {s.index: s.group for s in self.slots if s.state is SlotState.RUNNING}

    def wire_report(self) -> dict:
        wait = None if self.first_step_at is None else max(0.0, self.first_step_at - self.received_at)
        extra = {} if self.out_of_memory is None else dict(zip(("oom_rows", "oom_step"), self.out_of_memory))
        return convert.report_to_wire(self.report, wait_s=wait, wall_s=time.perf_counter() - self.received_at,
                                      steps_while_conditioned=self.steps_while_conditioned, **extra)


def assignment_of(arrival: Arrival, steps_run: int = 0) -> Assignment:
    """An arrival's assignment, not admitted yet (`steps_run`: the running batch's steps when it came)."""
    slots = []
    for i, item in enumerate(arrival.items):
        if isinstance(item, GroupOutput):
            slots.append(Slot(i, item.request_id, None, SlotState.UNREADABLE, output=item))
        else:
            slots.append(Slot(i, item.request_id, item, SlotState.QUEUED))
    return Assignment(arrival.batch_id, arrival.batch, arrival.received_at, slots, steps_at_receipt=steps_run)


class RunningBatch:
    def __init__(self, adapter: stepping.StepAdapter, capacity: int | None = None, step_delay_s: float = 0.0,
                 preparer: Preparer | None = None):
        self.adapter = adapter
        self.registered = capacity  # the rows it registered with; None: whatever the scheduler sends
        self.capacity = capacity  # rows it admits at once: fewer when the scheduler says so
        self.preparer = preparer
        # test/benchmark knob: every step takes this much longer, as a slower model's would (and is timed so)
        self.step_delay_s = step_delay_s
        self.assignments: OrderedDict[int, Assignment] = OrderedDict()  # in arrival order
        self.rows_admitted = 0  # rows of admitted groups that have no output yet
        self.steps_run = 0
        self.step_attempts = 0  # steps tried, failed ones too: an out-of-memory incident's number
        self.leaving = False  # what is not admitted is given back: do not condition it early

    # ---- arrivals and admission ------------------------------------------------------------------------

    def arrive(self, arrival: Arrival) -> None:
        # the scheduler lowers a worker's rows (it ran out of memory, its memory budget caps it) and says
        # so with every assignment; what it sends ahead of time must wait for those rows, not these
        if self.registered is not None:
            self.capacity = min(self.registered, arrival.rows) if arrival.rows else self.registered
        self.assignments[arrival.batch_id] = assignment_of(arrival, self.steps_run)
        self._advance()

    def admit(self, msg: protocol.BatchMsg, received_at: float, kind: protocol.Kind = protocol.Kind.JOIN) -> None:
        """Decode and take an assignment here (tests; the worker decodes on its IO thread)."""
        self.arrive(arrival_from_wire(msg, kind, received_at))

    def _fits(self, a: Assignment) -> bool:
        if a.batch and self.rows_admitted:
            return False  # a BATCH runs on its own
        # an assignment larger than the worker still runs alone: the scheduler sized it
        return self.capacity is None or not self.rows_admitted or self.rows_admitted + a.rows <= self.capacity

    def _advance(self) -> None:
        """Admit what waits while it fits (arrival order: nothing overtakes), then join what is ready.
        What still waits for rows is conditioned meanwhile on the conditioning thread, while others run:
        it joins as soon as rows free, instead of holding them idle through its conditioning."""
        waiting = False
        idle = None  # admitting readies groups but runs none: it holds through this loop
        for a in self.assignments.values():
            if a.admitted:
                continue
            if waiting or not self._fits(a):
                waiting = True
                idle = self.idle if idle is None else idle
                if not idle:  # with nothing running, it starts on the compute thread once admitted
                    self._prepare_early(a)
                continue
            self._admit(a)
        for a in self.assignments.values():
            if not a.admitted:
                break
            if a.joined:
                continue
            if any(s.state in (SlotState.QUEUED, SlotState.PREPARING) for s in a.slots):
                break  # assignments join in arrival order
            for s in a.slots:
                if s.state is SlotState.READY:
                    s.to(SlotState.RUNNING)
            a.joined = True
            a.steps_while_conditioned = self.steps_run - a.steps_at_receipt

    def _prepare_early(self, a: Assignment) -> None:
        if self.preparer is None or not a.early or self.leaving:
            return
        for s in a.slots:
            if s.state is SlotState.QUEUED:
                s.to(SlotState.PREPARING)
                s.early = True
                self.preparer.submit(a.batch_id, s.index, s.item, a.token)

    def _admit(self, a: Assignment) -> None:
        a.admitted = True
        self.rows_admitted += a.rows
        for s in a.slots:
            if s.state is SlotState.QUEUED:
                self._start(a, s)

    def _start(self, a: Assignment, s: Slot) -> None:
        """Start an admitted group: aside while others run, else here."""
        if self.preparer is not None and not self.idle:
            s.to(SlotState.PREPARING)
            self.preparer.submit(a.batch_id, s.index, s.item, a.token)
            return
        # through the preparer when there is one: its start of a group may still be under way
        start = self.adapter.start if self.preparer is None else self.preparer.start
        try:
            s.to(SlotState.READY, group=start(s.item))
        except Exception as exc:  # noqa: BLE001 - one bad group never fails the others
            self._failed(a, s, exc)

    def prepared(self, done: Prepared) -> None:
        """A group the preparer started (or failed to start); its assignment joins once all are back."""
        a = self.assignments.get(done.batch_id)
        if a is not None and a.token != done.token:
            a = None  # for an assignment let go of before this one arrived with the same id
        s = None if a is None else a.slots[done.index]
        if s is None or s.state is not SlotState.PREPARING:  # cancelled while it was being prepared
            if done.group is not None:
                self._release(done.group)
                if a is not None:
                    self._account(a, done.group)
            return
        if done.error is not None and s.early and stepping.is_out_of_memory(done.error):
            # Conditioned early, beside the rows that run: not its own rows that did not fit, and no
            # reason to make the scheduler shrink the worker. It starts again once admitted (now, if its
            # rows freed while this start was under way).
            log.warning("group %s ran out of memory conditioned early; it starts once admitted", s.request_id)
            a.early = False
            s.early = False
            s.to(SlotState.QUEUED)
            if a.admitted:
                self._start(a, s)
        elif done.error is not None:
            self._failed(a, s, done.error)
        else:
            s.to(SlotState.READY, group=done.group)
        self._advance()

    def _failed(self, a: Assignment, s: Slot, exc: BaseException) -> None:
        if not isinstance(exc, stepping.BadRequest):
            log.error("group %s could not start", s.request_id, exc_info=exc)
        self._finish(a, s, SlotState.DONE, stepping.error_output(s.request_id, exc))

    def _finish(self, a: Assignment, s: Slot, state: SlotState, output: GroupOutput) -> None:
        """Give a live slot its output; its rows are free from now on."""
        if a.admitted:
            self.rows_admitted -= s.rows
        s.to(state, output=output)

    # ---- queries -------------------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not any(s.state is SlotState.RUNNING for a in self.assignments.values() for s in a.slots)

    @property
    def waiting(self) -> bool:
        """Nothing to step and nothing to answer: only groups being prepared, or nothing at all."""
        return self.idle and not any(a.complete for a in self.assignments.values())

    def give_back(self) -> list[int]:
        """The assignments not admitted yet (waiting for rows): let go of, their ids. A leaving worker hands
        them back to be run elsewhere now instead of after what it runs. None of their groups has stepped;
        one started early on the conditioning thread is released here, or when it comes back (`prepared`)."""
        ids = []
        for batch_id, a in list(self.assignments.items()):
            if a.admitted or a.complete:  # a complete one (its starts failed) is answered with its errors
                continue
            self._let_go(a)
            del self.assignments[batch_id]
            ids.append(batch_id)
        if ids:
            self._advance()
        return ids

    # ---- cancels, steps, answers -----------------------------------------------------------------------------

    def drop(self, cancelled: dict[int, set[str]]) -> None:
        """Let go of the groups the scheduler cancelled (by assignment id), wherever they are."""
        for batch_id, request_ids in cancelled.items():
            a = self.assignments.get(batch_id)
            if a is None:
                continue
            for s in a.slots:
                if s.request_id not in request_ids or s.state not in _LIVE:
                    continue
                group = s.group
                if group is not None:  # READY or RUNNING: the adapter holds it; a PREPARING one is released later
                    self._release(group)
                    self._account(a, group)  # the conditioning and steps it did ran on this worker all the same
                elif s.state is SlotState.PREPARING and self.preparer is not None:
                    self.preparer.forget(a.batch_id, s.index, a.token)  # not started yet: it never will be
                self._finish(a, s, SlotState.CANCELLED, GroupOutput(s.request_id, "cancelled"))
        self._advance()

    def step(self) -> tuple[int, int, float, str]:
        """One denoise step of every running group: (forwards, rows, seconds, forward label); the label
        is empty when groups of several labels shared the step (the cost model then skips it)."""
        members = [(a, s) for a in self.assignments.values() for s in a.slots if s.state is SlotState.RUNNING]
        if not members:
            return 0, 0, 0.0, ""
        labels = {s.item.sampling.forward_label() for _a, s in members}
        label = labels.pop() if len(labels) == 1 else ""
        groups = [s.group for _a, s in members]
        started = time.perf_counter()
        self.step_attempts += 1
        for a, _s in members:
            if a.first_step_at is None:
                a.first_step_at = started
        try:
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            forwards = self.adapter.step(groups)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails the groups that shared it
            log.exception("a denoise step failed")
            if stepping.is_out_of_memory(exc):
                # numbered by attempt: two failures in a row, no step run between them, are two incidents
                blame = (sum(s.rows for _a, s in members), self.step_attempts)
                for a, _s in members:
                    a.out_of_memory = blame
            for a, s in members:
                group = s.group
                self._release(group)
                self._account(a, group)
                self._finish(a, s, SlotState.DONE, stepping.error_output(s.request_id, exc))
            self._advance()
            return 0, 0, time.perf_counter() - started, ""
        elapsed = time.perf_counter() - started
        stepping.charge_step(groups, elapsed)
        self.steps_run += 1
        for a, s in members:
            group = s.group
            if not group.done:
                continue
            try:
                output = self.adapter.finish(group)
                if not isinstance(output, GroupOutput):  # it could not even be answered as an error
                    raise TypeError(f"the adapter's finish returned {type(output).__name__}, not a GroupOutput")
            except Exception as exc:  # noqa: BLE001
                log.exception("group %s could not finish", s.request_id)
                output = stepping.error_output(s.request_id, exc)
            self._account(a, group)
            self._finish(a, s, SlotState.DONE, output)
        self._advance()
        return forwards, sum(g.rows for g in groups), elapsed, label

    def _release(self, group: Any) -> None:
        """Release a group on its way out. A release that raises (a sticky device error after a failed
        forward) is logged and the worker goes on: the group's answer does not depend on it, and an
        exception here would leave the rest of the running batch unanswered."""
        try:
            self.adapter.release(group)
        except Exception:  # noqa: BLE001
            log.exception("releasing group %s failed", getattr(group, "request_id", "?"))

    def _let_go(self, a: Assignment) -> None:
        """Release what the adapter holds of `a`, and skip its starts still queued on the conditioning
        thread (one already under way is released when it comes back: `prepared`)."""
        for s in a.slots:
            if s.group is not None:
                self._release(s.group)
                s.group = None
            elif s.state is SlotState.PREPARING and self.preparer is not None:
                self.preparer.forget(a.batch_id, s.index, a.token)

    def abandon(self) -> list[Assignment]:
        """Let go of every assignment held, wherever its groups are, and return them (the rows are all
        free). Only slot-independent cleanup runs here: it is also the way out when the batch's own
        state may be inconsistent (the compute thread failed half-way through a step)."""
        gone = list(self.assignments.values())
        self.assignments.clear()
        self.rows_admitted = 0
        for a in gone:
            self._let_go(a)
        return gone

    @staticmethod
    def _account(a: Assignment, g: stepping.RunningGroup) -> None:
        r = g.report
        stepping.add_group_report(a.report, r)
        a.report.denoise_s += r.denoise_s
        a.report.transformer_forwards = max(a.report.transformer_forwards, r.transformer_forwards)
        a.report.steps_run = max(a.report.steps_run, r.steps_run)
        a.report.peak_memory_bytes = max(a.report.peak_memory_bytes, r.peak_memory_bytes)

    def take_done(self) -> list[Assignment]:
        done = [a for a in self.assignments.values() if a.complete]
        for a in done:
            del self.assignments[a.batch_id]
        if done:
            self._advance()
        return done


def abandoned_outputs(a: Assignment, exc: BaseException) -> list[GroupOutput]:
    """The answer of an assignment the worker let go of because its compute thread failed: the outputs
    its groups already have, and `worker_error` for the rest (the scheduler retries those from their
    snapshots, elsewhere or here)."""
    error = f"the worker's compute thread failed: {stepping.describe_exception(exc)}"
    return [s.output if s.finished and s.output is not None
            else GroupOutput(s.request_id, "error", error=error, error_code="worker_error") for s in a.slots]
