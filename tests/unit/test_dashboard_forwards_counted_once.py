"""The dashboard's "transformer forwards" line against the forwards a worker ran.

Under step-level batching the assignments in a worker's running batch share its forwards, and each
assignment's report counts every forward its groups took part in (worker/running.py): two assignments
that ran four steps together report 4 + 4. `transformer_forwards_total` adds the reports up, so the panel
"Physical batches and forwards /s" drew twice the forwards run. The heartbeats carry one record per
forward run (worker/loop.py), which the scheduler counts in `forward_rows_count`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from candidate_scheduler.service.metrics import SchedulerMetrics
from candidate_scheduler.worker.null_adapter import NullAdapter
from candidate_scheduler.worker.running import RunningBatch
from tests.unit.test_dashboard_panels import _evaluate, _panel, _totals
from tests.unit.test_preparing import _assignment


def _run_two_assignments_together(steps: int) -> tuple[int, dict[int, dict], list[tuple[int, float, str]]]:
    """What a worker runs and says: (forwards run, each assignment's report, its heartbeat records)."""
    batch = RunningBatch(NullAdapter(8), 8)
    batch.admit(_assignment(1, "a", steps=steps), 0.0)
    batch.admit(_assignment(2, "b", steps=steps), 0.0)
    run, reports, records = 0, {}, []
    while batch.assignments:
        forwards, rows, seconds, label = batch.step()
        run += forwards
        if forwards:  # as worker/loop.py records them for its heartbeats
            records += [(max(1, rows // forwards), seconds / forwards, label)] * forwards
        for a in batch.take_done():
            reports[a.batch_id] = a.wire_report()
    return run, reports, records


def test_the_transformer_forwards_line_counts_a_shared_forward_once():
    run, reports, records = _run_two_assignments_together(steps=4)
    assert run == 4 and sorted(r["transformer_forwards"] for r in reports.values()) == [4, 4]

    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    before = _totals(registry)
    # what core/worker_link.py records: each result's report, each heartbeat's forwards
    for report in reports.values():
        metrics.worker_report(report)
    for rows, seconds, _label in records:
        metrics.forward(rows, max(seconds, 1e-6))
    after = _totals(registry)

    [target] = [t for t in _panel("Physical batches and forwards /s")["targets"]
                if t["legendFormat"].startswith("transformer forwards")]
    assert _evaluate(target["expr"], before, after, 1.0) == run
