"""A slice's retry budget (`retry_limit`, attempts per slice, the first included) is for the worker's faults:
a slice planned again because the worker ran out of memory (core/worker_link.py, "Out of memory") is not
a failed attempt, and must not leave fewer attempts for a worker that dies or errs afterwards."""

from __future__ import annotations

import numpy as np

from tests.unit.test_engine import Harness, reduced


def _live(h: Harness, rid: str) -> list:
    return [w for w in h.work if w.batch_id in h.engine.assignments
            and any(s.dispatch.request_id == rid for s in w.slices)]


def test_out_of_memory_replans_do_not_use_up_the_attempts_left_for_worker_faults():
    h = Harness(batching="step", retry_limit=2)  # two attempts for a worker fault: one retry
    h.register("w1", capacity=8)
    h.submit("big", count=6, seed=1)
    h.submit("g", count=2, seed=2)  # joins: the two share every forward, 8 rows
    for w in list(h.work):  # the shared forward ran out of memory: every assignment says so
        h.answer(w, status="error", error_code="out_of_memory", report={"oom_rows": 8, "oom_step": 1})
    assert h.engine.workers["w1"].capacity == 7 and not h.replies
    for _ in range(10):  # "big" runs again; "g" (2 rows, it still fits) waits for rows, then runs
        if _live(h, "g"):
            break
        h.answer(_live(h, "big")[0])
    (send,) = _live(h, "g")
    assert len(send.slices[0].dispatch.candidate_ids) == 2  # not split: the same slice, planned again
    h.answer(send, status="error", error_code="worker_error")  # its first worker fault: retried
    assert "g" not in h.replies, h.replies.get("g")
    h.run_all()
    r = h.reply("g")
    assert r.status == "done" and np.allclose(r.action, reduced(r.candidate_seeds))
    assert r.metrics["retries"] == 2  # the reply still counts both runs that did not finish
