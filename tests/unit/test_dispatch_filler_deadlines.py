"""Dispatch batching: a filler taken from behind a queued deadline group must not make that group late.

The engine against one simulated 2-row dispatch worker that runs each batch in exactly the time the cost
model predicted for it (no noise, no margin): whatever misses here is the policy's doing. A forward of r
rows takes 0.01 + 0.0025 r s, 10 steps: a 1-row slice 0.125 s, a 2-row one 0.15 s.

- t=0.00 `busy`: best effort, 2 candidates: the worker runs it until 0.15;
- t=0.01 `soon`: 1 candidate, due at 0.40;
- t=0.02 `tight`: 2 candidates, due at 0.43. At receipt: `soon` 0.15-0.275, `tight` 0.275-0.425: in time,
  admitted;
- t=0.03 `filler`: best effort, 1 candidate.

At 0.15 `soon` heads the queue with a row left over; `tight` (2 rows) does not fit it, `filler` does. The
batch guard (core/batch_deadlines.py) asks only whether the groups IN the batch stay in time (`soon` ends
at 0.30 either way), so `filler` joins, the batch takes 0.15 s instead of 0.125 s, and `tight` -- queued
ahead of `filler`, admitted before it -- starts at 0.30 and ends at 0.45: expired. A group without a
deadline, arriving later, broke a promise made to a group before it. Now a unit may not lengthen a batch
past a deadline group queued ahead of it that the batch left out: `filler` waits for the next batch.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import Registration, Reply, SendWork, SliceOutcome, WorkerResult
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.spec import ModelCapability
from candidate_scheduler.core.work import SamplingSpec

SAMPLING = {"height": 64, "width": 64, "steps": 10}
A_S, B_S = 0.01, 0.0025


def _serve(arrivals: list[tuple], rows: int = 2, best_effort_s: float = 30.0) -> dict[str, tuple[float, object]]:
    """(time, request id, count, deadline_s[, min_count]) arrivals against one exact dispatch worker; request
    id -> (time answered, result)."""
    engine = Engine(EngineConfig(batching="dispatch", prefetch=0, heartbeat_timeout_s=1e12,
                                 best_effort_s=best_effort_s))
    spec = SamplingSpec(**SAMPLING)
    capability = ModelCapability("sim", reducers=("mean",), max_candidates_per_batch=rows,
                                 max_candidates_per_group=64).to_dict()
    profile = tuple((spec.forward_label(), r, A_S + B_S * r) for r in (1, rows))
    events: list = []
    seq = itertools.count()
    replies: dict[str, tuple[float, object]] = {}

    def handle(out: list, now: float) -> None:
        for m in out:
            if isinstance(m, SendWork):  # the worker takes exactly what the cost model predicted
                heapq.heappush(events, (now + engine.assignments[m.batch_id].predicted_s, next(seq), m))
            elif isinstance(m, Reply):
                assert m.result.request_id not in replies, "answered twice"
                replies[m.result.request_id] = (now, m.result)

    handle(engine.register(b"w", Registration("w", capability, rows, profile=profile), 0.0), 0.0)
    image = np.zeros((64, 64, 3), np.uint8)
    for t, rid, count, deadline_s, *min_count in arrivals:
        candidates = {"count": count, "reducer": "mean", "min_count": min_count[0] if min_count else count}
        heapq.heappush(events, (t, next(seq), Submission(rid, image, "pick", candidates, 1, dict(SAMPLING),
                                                        deadline_s=deadline_s)))
    tick = 0.0
    while events:
        t, _, item = heapq.heappop(events)
        while tick <= t:
            handle(engine.tick(tick), tick)
            tick += 0.05
        if isinstance(item, Submission):
            handle(engine.submit(("c", item.request_id), item, t), t)
        else:
            outputs = tuple(SliceOutcome(sw.dispatch.request_id, "ok", sw.dispatch.candidate_ids,
                                         np.zeros((len(sw.dispatch.candidate_ids), 1, spec.horizon,
                                                   spec.raw_action_dim), np.float32)) for sw in item.slices)
            handle(engine.worker_result(b"w", WorkerResult("w", item.batch_id, outputs, {}), t), t)
    for _ in range(40):  # expiries of whatever is left
        handle(engine.tick(tick), tick)
        tick += 0.05
    return replies


ARRIVALS = [(0.00, "busy", 2, None), (0.01, "soon", 1, 0.39), (0.02, "tight", 2, 0.41), (0.03, "filler", 1, None)]


def test_the_deadline_groups_alone_are_all_in_time():
    # the control: without the late best-effort filler, both promises are kept
    replies = _serve(ARRIVALS[:3])
    for rid, arrived, due in (("soon", 0.01, 0.39), ("tight", 0.02, 0.41)):
        at, result = replies[rid]
        assert result.status == "done" and at - arrived <= due + 1e-9, (rid, at, result.status)


def test_a_later_filler_does_not_make_an_admitted_deadline_group_late():
    replies = _serve(ARRIVALS)
    at, result = replies["tight"]
    assert result.status == "done" and at - 0.02 <= 0.41 + 1e-9, (at, result.status, result.error_code)
    assert replies["filler"][1].status == "done"


def test_a_later_filler_does_not_jump_a_deadline_group_into_a_batch_headed_by_a_best_effort_group():
    # best effort groups are ordered as if due 0.3 s after receipt: `head` (best effort, at 0.01: as if due
    # 0.31) heads the batch at 0.15, `tight` (due 0.43) does not fit its row left, `filler` (best effort, at
    # 0.14: as if due 0.44) does, queued behind `tight`. With `filler` in it the batch ends at 0.30, not
    # 0.275, and `tight` at 0.45: late. A batch with no deadline group in it asked nothing of its fillers.
    arrivals = [(0.00, "busy", 2, None), (0.01, "head", 1, None), (0.02, "tight", 2, 0.41),
                (0.14, "filler", 1, None)]
    replies = _serve(arrivals, best_effort_s=0.3)
    at, result = replies["tight"]
    assert result.status == "done" and at - 0.02 <= 0.41 + 1e-9, (at, result.status, result.error_code)
    assert replies["filler"][1].status == "done" and replies["head"][1].status == "done"


def test_an_admitted_group_is_not_made_late_by_packing_the_forecast_assumed_but_the_engine_never_does():
    # `first` (8 candidates, min 1) and `second` (16, min 1) are forecast at 1 candidate each, packed into
    # one 0.15 s batch of 2 rows; `big` (16 candidates, due 1.896) is admitted at 1.81 and kept at 1.835
    # when `second` is admitted. `first` starts at 0.185 at its minimum; `second`, behind `first`'s four
    # slices, was past the planner's elastic look-ahead when it counted slices: it kept its count, did not
    # fit the row left, and started alone after `first` (0.1 s lost; `big` ended past its deadline). Now
    # the look-ahead counts groups: both shrink in the pass `first` starts in and share its batch.
    replies = _serve([(0.035, "head", 6, 0.858), (0.121, "first", 8, 0.557, 1), (0.145, "big", 16, 1.751),
                      (0.16, "second", 16, 0.62, 1)])
    at, result = replies["big"]
    assert result.status == "done" and at - 0.145 <= 1.751 + 1e-9, (at, result.status, result.error_code)
