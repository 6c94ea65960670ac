"""The fault drill's whole-assignment faults (worker/faults.py: `oom_rows`, `raise`) answer every output of
the assignment: the loop hands the hook the readable groups and the outputs of all of them, an
undecodable group's answer among those. Built from the readable ones, the answer came one output short and
the scheduler retried every group as a worker fault instead of the drill's out-of-memory re-plan. An
output that is already an answer for good (a bad request, a cancel) stays: replaced by the fault, a bad
request was retried until `retries_exhausted`, not the drill's "fault-free result"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from candidate_scheduler.core.work import GroupOutput
from candidate_scheduler.worker.faults import FaultyAdapter


@pytest.mark.parametrize("spec, code", [("oom_rows=0", "out_of_memory"), ("raise:1.0", "worker_error")])
def test_a_whole_assignment_fault_answers_every_output_of_it(spec, code):
    adapter = FaultyAdapter(SimpleNamespace(), spec)
    readable = SimpleNamespace(request_id="good", candidates=[0, 1], images=[0])
    outputs = [GroupOutput("unreadable", "error", error="could not decode", error_code="bad_request"),
               GroupOutput("good", "ok", [0, 1]), GroupOutput("gone", "cancelled")]
    mangled = adapter.mangle_result([readable], outputs)
    assert [(o.request_id, o.status, o.error_code) for o in mangled] == [
        ("unreadable", "error", "bad_request"), ("good", "error", code), ("gone", "cancelled", None)]
