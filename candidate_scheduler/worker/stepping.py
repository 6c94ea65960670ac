"""How a worker advances its running batch, one denoise step at a time.

A worker holds a *running batch*: candidate groups (or slices of groups) that each carry their own
conditioning, their own noise, their own solver state and their own step index. Every call to
`StepAdapter.step` advances each group it is given by exactly one denoise step; groups that can share a
transformer forward (same height, width, horizon, text length and CFG mode at this step) share one, with
a per-row timestep, and each group's own solver steps its own rows. A group joins between two steps
(`start`) and leaves between two steps (`finish` once it is done, `release` when it is cancelled), so
groups with different step counts, at different steps, with different prompts, seeds and guidance
values run side by side. Whatever shares a forward, a candidate's result depends only on its seed.

Every model adapter implements `StepAdapter`; `run_batch` drives one for a fixed set of groups from the
first step to the last (the in-process benchmark and the adapter tests use it; the worker loop in
loop.py drives the same interface with groups arriving and leaving).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from candidate_scheduler.core.work import BatchReport, GroupOutput, GroupWork


class BadRequest(ValueError):
    """A group that cannot run because of what it asks for (observations, prompts, initial noise,
    sampling the model cannot serve). No retry can fix it; `code` is a short stable machine code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class TransientFault(RuntimeError):
    """A failure that a retry from the candidates' snapshots can fix (an injected fault in drills, an
    out-of-memory error that a smaller slice avoids). Any other exception out of an adapter is a model
    error: the group is answered at once, never retried."""

    code = "worker_error"


class RunningGroup(Protocol):
    """One group (or slice of a group) in a running batch, as the worker loop sees it."""

    request_id: str
    steps: int  # denoise steps this group runs in all
    step_index: int  # steps already run (0 before the first)
    rows: int  # candidate rows it holds (candidates x observations)
    report: BatchReport  # this group's own share of the work so far

    @property
    def done(self) -> bool: ...


class StepAdapter(Protocol):
    def capability_dict(self) -> dict: ...

    def start(self, item: GroupWork) -> RunningGroup:
        """Conditioning and starting noise for one group; it joins the batch at the next `step`.
        Raises BadRequest for a request that cannot run."""

    def step(self, groups: Sequence[RunningGroup]) -> int:
        """Advance every group (none of them done) by one denoise step; returns the transformer
        forwards it ran (one per cohort of groups that could share one, whether it ran as one call or as
        several: `--call-rows`). Each group's own report counts the forwards it took part in and its
        steps."""

    def finish(self, group: RunningGroup) -> GroupOutput:
        """The output of a done group (actions, rollout data); the group leaves the batch."""

    def release(self, group: RunningGroup) -> None:
        """Drop a group that leaves before it is done (cancelled, expired, failed)."""


def charge_step(groups: Sequence[RunningGroup], elapsed: float) -> None:
    """Split one step's wall time over the groups that shared it, by rows (each group's denoise_s)."""
    total = sum(g.rows for g in groups) or 1
    for g in groups:
        g.report.denoise_s += elapsed * g.rows / total


def add_group_report(batch: BatchReport, group: BatchReport) -> None:
    """Fold a group's own work into a batch report (forwards and steps are counted per batch).
    Every group that started is folded in, whether it finished, was cancelled or failed."""
    batch.rows += group.rows
    batch.condition_s += group.condition_s
    batch.postprocess_s += group.postprocess_s
    batch.text_encodes += group.text_encodes
    batch.vae_encodes += group.vae_encodes
    batch.peak_memory_bytes = max(batch.peak_memory_bytes, group.peak_memory_bytes)


class OutOfMemory(TransientFault):
    """The rows did not fit the device's memory: the scheduler re-plans the slice smaller."""

    code = "out_of_memory"


def is_out_of_memory(exc: BaseException) -> bool:
    # torch.cuda.OutOfMemoryError (and torch.OutOfMemoryError) without importing torch here
    return isinstance(exc, (OutOfMemory, MemoryError)) or type(exc).__name__ == "OutOfMemoryError"


def error_output(request_id: str, exc: BaseException) -> GroupOutput:
    """The output of a group whose start, step or finish raised (see the failure taxonomy above)."""
    if is_out_of_memory(exc):
        return GroupOutput(request_id, "error", error=f"{type(exc).__name__}: {exc}", error_code="out_of_memory")
    if isinstance(exc, BadRequest):
        return GroupOutput(request_id, "error", error=str(exc), error_code=exc.code)
    if isinstance(exc, TransientFault):
        return GroupOutput(request_id, "error", error=f"{type(exc).__name__}: {exc}", error_code=exc.code)
    return GroupOutput(request_id, "error", error=describe_exception(exc), error_code="model_error")


def describe_exception(exc: BaseException) -> str:
    """`Type: message (raised at file:line in function)`: an AssertionError with no text still says
    what failed and where (sglang's UniPC asserts past ~110 steps on the tiny checkpoint)."""
    import traceback

    text = str(exc) or "(no message)"
    where = ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        last = frames[-1]
        path = last.filename
        for marker in ("site-packages/", "candidate_scheduler/"):
            if marker in path:
                path = path[path.index(marker) + len(marker):] if marker == "site-packages/" else path[path.index(marker):]
                break
        where = f" (raised at {path}:{last.lineno} in {last.name})"
    return f"{type(exc).__name__}: {text}{where}"


def run_batch(
    adapter: StepAdapter,
    items: Sequence[GroupWork],
    should_drop: Callable[[], Iterable[str]] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[list[GroupOutput], BatchReport]:
    """Run a fixed set of groups from their first step to their last; one output per item, in order.

    should_drop() is polled at every step boundary and returns request ids to cancel; on_step(i) runs
    just before the batch's step i. Groups with fewer steps leave as soon as they are done."""
    report = BatchReport()
    outputs: dict[int, GroupOutput] = {}
    running: dict[int, RunningGroup] = {}
    for i, item in enumerate(items):
        try:
            running[i] = adapter.start(item)
        except Exception as exc:  # noqa: BLE001 - one bad group never fails the others
            outputs[i] = error_output(item.request_id, exc)
    step = 0
    while running:
        if on_step is not None:
            on_step(step)
        if should_drop is not None:
            drop = set(should_drop() or ())
            for i in [i for i, g in running.items() if g.request_id in drop]:
                g = running.pop(i)
                adapter.release(g)
                add_group_report(report, g.report)
                outputs[i] = GroupOutput(items[i].request_id, "cancelled")
            if not running:
                break
        active = list(running.values())
        started = time.perf_counter()
        try:
            report.transformer_forwards += adapter.step(active)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails the groups that shared it
            for i, g in list(running.items()):
                adapter.release(g)
                add_group_report(report, g.report)
                outputs[i] = error_output(g.request_id, exc)
            running.clear()
            break
        elapsed = time.perf_counter() - started
        charge_step(active, elapsed)
        report.denoise_s += elapsed
        report.steps_run += 1
        step += 1
        for i in [i for i, g in running.items() if g.done]:
            g = running.pop(i)
            try:
                outputs[i] = adapter.finish(g)
            except Exception as exc:  # noqa: BLE001
                adapter.release(g)
                outputs[i] = error_output(g.request_id, exc)
            add_group_report(report, g.report)
    return [outputs[i] for i in range(len(items))], report
