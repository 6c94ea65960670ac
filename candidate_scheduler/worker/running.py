"""A worker's running batch: the assignments it holds, advanced one denoise step at a time.

The compute thread owns one `RunningBatch`. Each assignment (one BATCH or JOIN from the scheduler)
brings groups; they join at the next step boundary (`admit`), every step advances all running groups
together (`step`: the adapter shares forwards between the groups that can share them), a group that is
done leaves at once, and an assignment whose groups all have an output is handed back (`take_done`) to
be answered with one BATCH_RESULT. Cancelled groups leave at the next boundary (`drop`).

With a `Preparer` (preparing.py) the starts of an assignment that arrives while groups are running run
on the conditioning thread instead, and the running groups keep stepping; each started group comes back
through `prepared`. An assignment's groups join together, at the first boundary after the last of them
is ready, so the groups of one BATCH (and the slices of one JOIN) stay in lockstep and can share solver
steps. With nothing running there is nothing to overlap, and the compute thread starts the groups itself:
a compute thread that waited idle for the conditioning thread ran its first step 5-10 ms slower at
64x64 on these CPUs (bench/README.md, "Conditioning off the step loop").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import BatchReport, GroupOutput, GroupWork
from candidate_scheduler.worker import stepping
from candidate_scheduler.worker.preparing import Prepared, Preparer

log = logging.getLogger("candidate_scheduler.worker")


@dataclass
class Assignment:
    batch_id: int
    received_at: float  # perf_counter() when the IO thread read it
    items: list[GroupWork | None]  # None: the group could not be decoded (its output says why)
    outputs: dict[int, GroupOutput] = field(default_factory=dict)
    running: dict[int, stepping.RunningGroup] = field(default_factory=dict)
    report: BatchReport = field(default_factory=BatchReport)
    first_step_at: float | None = None
    preparing: set[int] = field(default_factory=set)  # given to the preparer, not back yet
    prepared: dict[int, stepping.RunningGroup] = field(default_factory=dict)  # back, waiting for the rest
    steps_at_receipt: int = 0  # the running batch's step count when it arrived
    steps_while_conditioned: int = 0  # steps the running batch took before this assignment joined

    @property
    def complete(self) -> bool:
        return len(self.outputs) == len(self.items)

    def wire_report(self) -> dict:
        wait = None if self.first_step_at is None else max(0.0, self.first_step_at - self.received_at)
        return convert.report_to_wire(self.report, wait_s=wait, wall_s=time.perf_counter() - self.received_at,
                                      steps_while_conditioned=self.steps_while_conditioned)


class RunningBatch:
    def __init__(self, adapter: stepping.StepAdapter, step_delay_s: float = 0.0, preparer: Preparer | None = None):
        self.adapter = adapter
        self.preparer = preparer
        # test/benchmark knob: every step takes this much longer, as a slower model's would (and is timed so)
        self.step_delay_s = step_delay_s
        self.assignments: dict[int, Assignment] = {}
        self.steps_run = 0

    @property
    def idle(self) -> bool:
        return not any(a.running for a in self.assignments.values())

    def admit(self, batch: protocol.BatchMsg, received_at: float) -> None:
        """Start every group of a new assignment (conditioning, noise, its own solvers), here or on the
        preparer's thread."""
        a = Assignment(batch.batch_id, received_at, [], steps_at_receipt=self.steps_run)
        aside = self.preparer is not None and not self.idle
        for i, g in enumerate(batch.groups):
            try:
                item = convert.work_from_wire(g)
            except (ValueError, TypeError) as exc:  # ProtocolError is a ValueError
                a.items.append(None)
                a.outputs[i] = GroupOutput(g.request_id, "error", error=str(exc), error_code="bad_request")
                continue
            a.items.append(item)
            if aside:
                a.preparing.add(i)
                continue
            try:
                a.running[i] = self.adapter.start(item)
            except Exception as exc:  # noqa: BLE001 - one bad group never fails the others
                self._failed_start(a, i, exc)
        self.assignments[a.batch_id] = a
        for i in sorted(a.preparing):
            self.preparer.submit(a.batch_id, i, a.items[i])

    def prepared(self, done: Prepared) -> None:
        """A group the preparer started (or failed to start); its assignment joins once all are back."""
        a = self.assignments.get(done.batch_id)
        if a is None or done.index not in a.preparing:  # cancelled while it was being prepared
            if done.group is not None:
                self.adapter.release(done.group)
                if a is not None:
                    self._account(a, done.group)
            return
        a.preparing.discard(done.index)
        if done.error is not None:
            self._failed_start(a, done.index, done.error)
        else:
            a.prepared[done.index] = done.group
        self._join_when_ready(a)

    @property
    def waiting(self) -> bool:
        """Nothing to step and nothing to answer: only groups being prepared, or nothing at all."""
        return self.idle and not any(a.complete for a in self.assignments.values())

    def _join_when_ready(self, a: Assignment) -> None:
        if not a.preparing and a.prepared:
            a.running.update(a.prepared)
            a.prepared.clear()
            a.steps_while_conditioned = self.steps_run - a.steps_at_receipt

    @staticmethod
    def _failed_start(a: Assignment, i: int, exc: BaseException) -> None:
        item = a.items[i]
        if not isinstance(exc, stepping.BadRequest):
            log.error("group %s could not start", item.request_id, exc_info=exc)
        a.outputs[i] = stepping.error_output(item.request_id, exc)

    def drop(self, cancelled: dict[int, set[str]]) -> None:
        """Release the groups the scheduler cancelled (by assignment id)."""
        for batch_id, request_ids in cancelled.items():
            a = self.assignments.get(batch_id)
            if a is None:
                continue
            for groups in (a.running, a.prepared):
                for i, g in list(groups.items()):
                    if g.request_id in request_ids:
                        self.adapter.release(groups.pop(i))
                        a.outputs[i] = GroupOutput(g.request_id, "cancelled")
                        self._account(a, g)  # the conditioning and steps it did ran on this worker all the same
            for i in [i for i in a.preparing if a.items[i].request_id in request_ids]:
                a.preparing.discard(i)  # the preparer's group is released when it comes back
                a.outputs[i] = GroupOutput(a.items[i].request_id, "cancelled")
            self._join_when_ready(a)

    def step(self) -> tuple[int, int, float, str]:
        """One denoise step of every running group: (forwards, rows, seconds, forward label); the label
        is empty when groups of several labels shared the step (the cost model then skips it)."""
        members = [(a, i, g) for a in self.assignments.values() for i, g in a.running.items()]
        if not members:
            return 0, 0, 0.0, ""
        labels = {a.items[i].sampling.forward_label() for a, i, _g in members}
        label = labels.pop() if len(labels) == 1 else ""
        groups = [g for _a, _i, g in members]
        started = time.perf_counter()
        for a, _i, _g in members:
            if a.first_step_at is None:
                a.first_step_at = started
        try:
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            forwards = self.adapter.step(groups)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails the groups that shared it
            log.exception("a denoise step failed")
            for a, i, g in members:
                self.adapter.release(a.running.pop(i))
                a.outputs[i] = stepping.error_output(g.request_id, exc)
                self._account(a, g)
            return 0, 0, time.perf_counter() - started, ""
        elapsed = time.perf_counter() - started
        stepping.charge_step(groups, elapsed)
        self.steps_run += 1
        for a, i, g in members:
            if g.done:
                a.running.pop(i)
                try:
                    a.outputs[i] = self.adapter.finish(g)
                except Exception as exc:  # noqa: BLE001
                    log.exception("group %s could not finish", g.request_id)
                    a.outputs[i] = stepping.error_output(g.request_id, exc)
                self._account(a, g)
        return forwards, sum(g.rows for g in groups), elapsed, label

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
        return done
