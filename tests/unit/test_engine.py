"""The scheduling engine in process: fake workers, an injected clock, no sockets.

Every test drives core/engine.py with events and checks the messages it returns; "exactly one reply per
group" is asserted wherever a group ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core import reducers
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import (
    AckRegistration,
    CancelRows,
    Heartbeat,
    Registration,
    Reply,
    SendWork,
    SliceOutcome,
    StopWorker,
    WorkerResult,
)
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.spec import ModelCapability

IMAGE = np.full((16, 16, 3), 7, dtype=np.uint8)
H, D = 16, 7


def capability(max_batch: int = 8) -> dict:
    return ModelCapability("fake", reducers=("mean", "median", "medoid"), max_candidates_per_batch=max_batch,
                           max_candidates_per_group=256).to_dict()


def expected(seed: int, n_obs: int = 1) -> np.ndarray:
    """What the fake model answers for one candidate: a pure function of its seed, [B, H, D]."""
    rng = np.random.default_rng(seed)
    return np.repeat(rng.standard_normal((1, H, D)).astype(np.float32), n_obs, axis=0)


def submission(rid: str, count: int = 1, seed: int = 1, steps: int = 4, **kw) -> Submission:
    candidates = {"count": count, "reducer": kw.pop("reducer", "mean"), "return_candidates": True,
                  "min_count": kw.pop("candidates_min", None)}
    sampling = {"steps": steps, **kw.pop("sampling", {})}
    return Submission(rid, kw.pop("images", IMAGE), "pick", candidates, seed, sampling, **kw)


class Harness:
    """An engine, a clock, fake workers, and every message the engine sent."""

    def __init__(self, **config):
        # the rules below are stated for work sent only when it can start: prefetch has tests of its own
        self.engine = Engine(EngineConfig(**{"prefetch": 0, **config}))
        self.now = 100.0
        self.replies: dict[str, list] = {}
        self.work: list[SendWork] = []
        self.cancels: list[CancelRows] = []
        self.stops: list[StopWorker] = []

    def take(self, out: list) -> list:
        for m in out:
            if isinstance(m, Reply):
                self.replies.setdefault(m.result.request_id, []).append(m.result)
            elif isinstance(m, SendWork):
                self.work.append(m)
            elif isinstance(m, CancelRows):
                self.cancels.append(m)
            elif isinstance(m, StopWorker):
                self.stops.append(m)
        return out

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def submit(self, *args, **kw):
        return self.take(self.engine.submit(("client", args[0]), submission(*args, **kw), self.now))

    def register(self, worker_id: str, capacity: int = 8, max_batch: int = 8) -> list:
        return self.take(self.engine.register(worker_id.encode(), Registration(worker_id, capability(max_batch),
                                                                               capacity), self.now))

    def answer(self, send: SendWork, status: str = "ok", error_code: str | None = None, worker_id=None,
               report: dict | None = None) -> list:
        outputs = []
        for sw in send.slices:
            d = sw.dispatch
            if status == "ok":
                n_obs = sw.group.request.observations
                acts = np.stack([expected(s, n_obs) for s in d.seeds])
                outputs.append(SliceOutcome(d.request_id, "ok", d.candidate_ids, acts))
            else:
                outputs.append(SliceOutcome(d.request_id, status, error="boom", error_code=error_code))
        wid = worker_id or send.identity.decode()
        result = WorkerResult(wid, send.batch_id, tuple(outputs), report or {"transformer_forwards": 4})
        return self.take(self.engine.worker_result(send.identity, result, self.now))

    def beat(self, worker_id: str, running=()) -> list:
        return self.take(self.engine.heartbeat(worker_id.encode(), Heartbeat(worker_id, tuple(running)), self.now))

    def reply(self, rid: str):
        got = self.replies.get(rid, [])
        assert len(got) == 1, f"{rid}: {len(got)} replies"
        return got[0]

    def run_all(self) -> None:
        """Answer every outstanding assignment until none is left."""
        while True:
            pending = [w for w in self.work if w.batch_id in self.engine.assignments]
            if not pending:
                return
            for w in pending:
                self.answer(w)


def reduced(seeds, reducer="mean") -> np.ndarray:
    return reducers.reduce(reducer, np.stack([expected(s) for s in seeds]).astype(np.float32))[0]


def test_engine_atomic_group_runs_as_one_batch_and_answers_once():
    h = Harness()
    assert any(isinstance(m, AckRegistration) for m in h.register("w1"))
    h.submit("g", count=4, seed=9)
    assert len(h.work) == 1 and [len(s.dispatch.candidate_ids) for s in h.work[0].slices] == [4]
    h.answer(h.work[0])
    r = h.reply("g")
    assert r.status == "done" and r.metrics["admission_mode"] == "atomic"
    np.testing.assert_array_equal(r.candidates, np.stack([expected(s)[0] for s in r.candidate_seeds]))
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))
    assert h.engine.stats()["groups_in_flight"] == 0 and not h.engine.assignments


def test_engine_reply_carries_the_workers_own_time_share_by_share():
    h = Harness()
    h.submit("a", count=2, seed=1)
    h.submit("b", count=2, seed=2)
    h.register("w1")  # both queued: co-batched, one assignment, half its time each
    (send,) = h.work
    assert len(send.slices) == 2
    h.answer(send, report={"transformer_forwards": 4, "wall_s": 0.5, "condition_s": 0.1, "denoise_s": 0.3})
    for rid in ("a", "b"):
        m = h.reply(rid).metrics
        assert m["worker_s"] == pytest.approx(0.25) and m["denoise_s"] == pytest.approx(0.15)


def test_engine_microbatch_splits_and_completes_every_slice():
    h = Harness()
    h.register("w1", capacity=3)
    h.submit("g", count=8, seed=5)
    h.run_all()
    r = h.reply("g")
    assert r.status == "done" and r.metrics["admission_mode"] == "microbatch" and r.metrics["microbatches"] == 3
    assert [sum(len(s.dispatch.candidate_ids) for s in w.slices) for w in h.work] == [3, 3, 2]
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))


def test_engine_sequential_policy_runs_one_candidate_per_slice():
    h = Harness(policy="sequential")
    h.register("w1", capacity=2)
    h.submit("g", count=3)
    h.run_all()
    slices = [s.dispatch.candidate_ids for w in h.work for s in w.slices]
    assert h.reply("g").metrics["admission_mode"] == "sequential" and sorted(slices) == [(0,), (1,), (2,)]


def test_engine_reject_policy_refuses_without_truncating():
    h = Harness(policy="reject")
    h.register("w1", capacity=4)
    h.submit("g", count=5)
    r = h.reply("g")
    assert r.status == "rejected" and r.error_code == "does_not_fit" and not h.work
    assert h.engine.status("g").state == "rejected"  # STATUS says what the reply said


def test_engine_group_waits_for_the_first_worker():
    h = Harness()
    h.submit("g", count=2)
    assert h.engine.status("g").state == "queued" and not h.work
    h.register("w1")
    assert len(h.work) == 1
    h.run_all()
    assert h.reply("g").status == "done"


def test_engine_co_batches_compatible_groups_in_queue_order():
    h = Harness()
    h.register("w1")
    h.submit("blocker", count=8, steps=4)  # takes the worker
    h.submit("a", count=3, steps=4)
    h.submit("odd", count=2, steps=9)  # another batch key: never shares a dispatch batch with a / b
    h.submit("b", count=4, steps=4)
    h.answer(h.work[0])
    second = h.work[1]
    assert [s.dispatch.request_id for s in second.slices] == ["a", "b"]
    h.run_all()
    assert [s.dispatch.request_id for s in h.work[2].slices] == ["odd"]
    assert h.reply("a").metrics["co_batched_batches"] == 1 and h.reply("odd").status == "done"


def test_engine_retries_from_snapshots_after_a_worker_is_lost():
    h = Harness(heartbeat_timeout_s=3.0)
    h.register("w1")
    h.submit("g", count=4, seed=3)
    first = h.work[0]
    h.register("w2")
    h.advance(3.5)
    h.beat("w2")
    h.take(h.engine.tick(h.now))  # w1 missed its heartbeats
    assert "w1" not in h.engine.workers
    retry = h.work[-1]
    assert retry.identity == b"w2" and retry.slices[0].dispatch.attempt == 2
    assert retry.slices[0].dispatch.seeds == first.slices[0].dispatch.seeds
    assert retry.slices[0].dispatch.snapshots == first.slices[0].dispatch.snapshots
    h.answer(first)  # the lost worker's late answer is discarded
    assert h.engine.counters["late_results_discarded"] == 1 and "g" not in h.replies
    h.answer(retry)
    assert h.reply("g").status == "done" and h.reply("g").metrics["retries"] == 1


def _register_as(h: Harness, pid: int) -> list:
    return h.take(h.engine.register(b"w1", Registration("w1", capability(8), 8, pid=pid), h.now))


def test_engine_worker_reregistering_fails_over_its_work():
    h = Harness()
    _register_as(h, pid=100)
    h.submit("g", count=2)
    _register_as(h, pid=200)  # it restarted under its id (another process): its batch is gone
    assert len(h.work) == 2 and h.work[1].slices[0].dispatch.attempt == 2
    h.answer(h.work[1])
    assert h.reply("g").status == "done"


def test_engine_a_repeated_register_from_the_same_process_is_answered_again_not_taken_for_a_restart():
    """A worker repeats an unanswered REGISTER every few seconds: a scheduler that stalled reads two, the
    second after it sent work. That work is still the worker's; the second REGISTER is answered again."""
    h = Harness()
    first = _register_as(h, pid=100)
    h.submit("g", count=2)
    again = _register_as(h, pid=100)
    assert [type(m).__name__ for m in first] == [type(m).__name__ for m in again] == ["AckRegistration"]
    assert len(h.work) == 1 and list(h.engine.workers["w1"].assignments) == [h.work[0].batch_id]
    h.answer(h.work[0])
    r = h.reply("g")
    assert r.status == "done" and r.metrics["retries"] == 0 and h.engine.counters["late_results_discarded"] == 0


def test_engine_detects_a_batch_lost_on_the_link():
    h = Harness(heartbeat_timeout_s=3.0)
    h.register("w1")
    h.submit("g", count=2)
    batch = h.work[0].batch_id
    h.advance(1.0)
    h.beat("w1", running=[batch])
    h.advance(2.5)
    h.beat("w1", running=[])  # alive, but it no longer holds the batch: not yet past the timeout
    assert len(h.work) == 1
    h.advance(1.0)
    h.beat("w1", running=[])
    assert len(h.work) == 2 and h.engine.counters["batches_lost"] == 1
    h.answer(h.work[1])
    assert h.reply("g").status == "done"


def test_engine_discards_late_and_duplicate_results():
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)
    send = h.work[0]
    h.answer(send)
    h.answer(send)  # a duplicate of an answered assignment
    h.answer(send, worker_id="w9")  # an unknown worker: asked to register
    assert h.engine.counters["late_results_discarded"] == 2
    assert h.stops and h.stops[-1].reason == "reregister"
    assert h.reply("g").status == "done"


def test_engine_model_error_is_answered_at_once_with_its_message():
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)
    h.answer(h.work[0], status="error", error_code="model_error")
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == "model_error" and r.error == "boom"
    assert len(h.work) == 1  # never retried


def test_engine_transient_errors_are_retried_up_to_the_limit():
    h = Harness(retry_limit=3)
    h.register("w1")
    h.submit("g", count=2)
    for _ in range(3):
        h.answer(h.work[-1], status="error", error_code="worker_error")
    r = h.reply("g")
    assert r.status == "failed" and r.error_code == "retries_exhausted" and len(h.work) == 3


def test_engine_malformed_result_is_retried():
    h = Harness()
    h.register("w1")
    h.submit("g", count=2, seed=4)
    send = h.work[0]
    d = send.slices[0].dispatch
    bad = SliceOutcome(d.request_id, "ok", d.candidate_ids, np.zeros((2, 1, H, D + 1), np.float32))
    h.take(h.engine.worker_result(b"w1", WorkerResult("w1", send.batch_id, (bad,)), h.now))
    assert len(h.work) == 2 and "g" not in h.replies
    h.answer(h.work[1])
    assert h.reply("g").status == "done"


@pytest.mark.parametrize("state", ["queued", "admitted", "running", "reducing", "done", "unknown"])
def test_engine_cancel_in_every_state_answers_once(state):
    h = Harness()
    rid = "g"
    if state != "queued":
        h.register("w1", capacity=2)
    if state == "admitted":
        h.submit("blocker", count=2)  # the only worker is busy: g is admitted, not dispatched
    if state != "unknown":
        h.submit(rid, count=2)
    if state == "reducing":
        g = h.engine.groups[rid]
        send = h.work[0]
        g.complete_slice(0, "w1", send.slices[0].dispatch.candidate_ids,
                         np.stack([expected(s) for s in send.slices[0].dispatch.seeds]))
    if state == "done":
        h.run_all()
    found = h.engine.status(rid).state
    answer, out = h.engine.cancel(rid, h.now)
    h.take(out)
    assert answer.state == state == found
    assert answer.changed == (state not in ("done", "unknown"))
    again, _ = h.engine.cancel(rid, h.now)
    assert not again.changed
    if state == "unknown":
        assert rid not in h.replies
        return
    r = h.reply(rid)
    assert r.status == ("done" if state == "done" else "cancelled")
    if state in ("running", "reducing"):
        assert [c.request_ids for c in h.cancels] == [(rid,)]  # the worker is told to drop it
        h.answer(h.work[0])  # its answer arrives after the cancel: discarded, still one reply
        assert h.reply(rid).status == "cancelled"


def test_engine_cancel_racing_a_completion_answers_once():
    h = Harness()
    h.register("w1")
    h.submit("g", count=2)
    send = h.work[0]
    _, out = h.engine.cancel("g", h.now)
    h.take(out)
    h.answer(send)  # the worker finished before it saw the cancel
    assert h.reply("g").status == "cancelled"
    h.submit("g2", count=1)  # the worker is free again
    assert h.work[-1].slices[0].dispatch.request_id == "g2"


def test_engine_drain_finishes_admitted_groups_and_refuses_new_ones():
    h = Harness()
    h.register("w1")
    h.submit("in", count=2)
    assert h.engine.drain().changed and not h.engine.drain().changed
    h.submit("late", count=2)
    assert h.reply("late").status == "rejected" and h.reply("late").error_code == "draining"
    h.run_all()
    assert h.reply("in").status == "done"


def test_engine_shutdown_answers_everything_once_and_leaves_the_workers_to_their_heartbeats():
    h = Harness()
    h.register("w1", capacity=2)
    for i in range(3):
        h.submit(f"g{i}", count=2)
    h.take(h.engine.shutdown(h.now))
    for i in range(3):
        r = h.reply(f"g{i}")
        assert r.status == "failed" and r.error_code == "shutting_down"
    # nothing to the worker: a REGISTER it sent back would go to this run as it closes, and be lost; its
    # heartbeats find the next run, which asks it to register
    assert h.stops == []
    h.answer(h.work[0])  # a result after shutdown changes nothing
    assert all(len(v) == 1 for v in h.replies.values())


def test_engine_expires_groups_at_their_deadline():
    h = Harness()
    h.register("w1")
    h.submit("g", count=2, deadline_s=1.0)
    h.advance(0.5)
    h.take(h.engine.tick(h.now))
    assert "g" not in h.replies
    h.advance(0.6)
    h.take(h.engine.tick(h.now))
    assert h.reply("g").status == "expired" and h.cancels


def test_engine_refuses_bad_input_with_typed_errors_and_keeps_serving():
    h = Harness(max_queued_groups=2)
    h.register("w1", capacity=1)
    h.submit("", count=1)
    h.submit("neg", count=0)
    h.submit("img", images=np.zeros((4, 4), np.uint8))
    h.submit("steps", sampling={"steps": 0})
    h.submit("seed", count=2, seed=-1)  # checked when the candidates' seeds are derived
    assert h.reply("").error_code == "invalid_value" and h.reply("neg").error_code == "invalid_count"
    assert h.reply("img").status == "invalid" and h.reply("steps").status == "invalid"
    assert h.reply("seed").status == "invalid" and h.reply("seed").error_code == "invalid_seed"
    h.submit("a", count=1)
    # its owner resubmits from the same destination: one answer there (tests/unit/test_resubmission.py)
    h.submit("a", count=1)
    assert "a" not in h.replies
    h.submit("b", count=1)
    h.submit("c", count=1)
    assert h.reply("c").status == "overloaded"
    h.run_all()
    assert [r.status for r in h.replies["a"]] == ["done"] and h.reply("b").status == "done"


def test_engine_a_reducer_that_raises_fails_its_group_and_the_engine_keeps_serving():
    def broken(stacked):
        raise ZeroDivisionError("a model reducer's own bug")

    reducers.register_reducer("broken", broken)
    try:
        h = Harness()
        h.take(h.engine.register(b"w1", Registration("w1", ModelCapability(
            "fake", reducers=("mean", "broken"), max_candidates_per_batch=8).to_dict(), 8), h.now))
        h.submit("bad", count=3, reducer="broken")
        h.run_all()
        r = h.reply("bad")
        assert r.status == "failed" and r.error_code == "reducer_error" and "ZeroDivisionError" in r.error
        h.submit("next", count=2)
        h.run_all()
        assert h.reply("next").status == "done" and h.engine.stats()["groups_in_flight"] == 0
    finally:
        reducers.unregister_reducer("broken")


# ---- step-level batching --------------------------------------------------------------------------------


def test_engine_step_mode_joins_a_busy_worker_within_its_rows():
    h = Harness(batching="step")
    h.register("w1", capacity=8)
    h.submit("long", count=4, steps=100)
    h.submit("short", count=2, steps=4)
    h.submit("big", count=4, steps=4)  # 4 + 2 + 4 > 8: waits for rows
    assert [w.join for w in h.work] == [False, True]
    assert [w.slices[0].dispatch.request_id for w in h.work] == ["long", "short"]
    h.answer(h.work[1])  # the short group leaves at once, without waiting for the long one
    assert h.reply("short").status == "done" and h.reply("short").metrics["joined_running_batches"] == 1
    assert h.work[-1].slices[0].dispatch.request_id == "big" and h.work[-1].join
    h.run_all()
    assert h.reply("long").status == "done" and h.reply("big").status == "done"


def test_engine_step_mode_never_starves_a_large_group_at_the_head():
    h = Harness(batching="step")
    h.register("w1", capacity=8)
    h.submit("running", count=6, steps=100)
    h.submit("large", count=8, steps=4)  # blocked: needs the whole worker
    for i in range(5):  # a stream of small groups that would fit the 2 free rows
        h.submit(f"small{i}", count=1, steps=4)
    assert [w.slices[0].dispatch.request_id for w in h.work] == ["running"]  # the worker is reserved
    h.answer(h.work[0])
    assert h.work[1].slices[0].dispatch.request_id == "large"
    h.run_all()
    assert all(h.reply(f"small{i}").status == "done" for i in range(5))


def test_engine_step_mode_small_groups_flow_to_workers_nobody_reserved():
    h = Harness(batching="step")
    h.register("w1", capacity=8)
    h.register("w2", capacity=8)
    h.submit("r1", count=6, steps=100)
    h.submit("r2", count=6, steps=100)
    h.submit("large", count=8)  # reserves one worker
    h.submit("small", count=1)  # joins the other one
    placed = {w.slices[0].dispatch.request_id: w for w in h.work}
    assert "large" not in placed
    assert placed["small"].identity == placed["r2"].identity != placed["r1"].identity  # r1's worker is reserved
    h.answer(placed["r1"])
    assert h.work[-1].slices[0].dispatch.request_id == "large" and h.work[-1].identity == placed["r1"].identity


def test_engine_step_mode_different_forward_keys_do_not_join():
    h = Harness(batching="step")
    h.register("w1", capacity=8)
    h.submit("a", count=2, sampling={"height": 64})
    h.submit("b", count=2, sampling={"height": 128})
    h.submit("c", count=2, steps=9)  # other step count, same shape: may join
    assert [w.slices[0].dispatch.request_id for w in h.work] == ["a"]  # b blocks (and reserves) the worker
    h.answer(h.work[0])
    assert h.work[1].slices[0].dispatch.request_id == "b"


def test_engine_step_mode_worker_death_fails_over_every_group_it_ran():
    h = Harness(batching="step", heartbeat_timeout_s=1.0)
    h.register("w1", capacity=8)
    for i in range(3):
        h.submit(f"g{i}", count=2, seed=i, steps=10 * (i + 1))
    assert len(h.engine.workers["w1"].assignments) == 3
    h.register("w2", capacity=8)
    h.advance(1.5)
    h.beat("w2")
    h.take(h.engine.tick(h.now))
    retries = [w for w in h.work if w.identity == b"w2"]
    assert sorted(w.slices[0].dispatch.request_id for w in retries) == ["g0", "g1", "g2"]
    assert all(w.slices[0].dispatch.attempt == 2 for w in retries)
    h.run_all()
    for i in range(3):
        assert h.reply(f"g{i}").status == "done"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "answer", "cancel", "tick", "die", "fail"]),
                          st.integers(0, 7)), min_size=1, max_size=60),
       st.sampled_from(["dispatch", "step"]))
def test_engine_every_group_gets_exactly_one_reply(events, batching):
    h = Harness(batching=batching, retry_limit=2, heartbeat_timeout_s=5.0)
    h.register("w1", capacity=4)
    submitted = []
    for kind, x in events:
        h.advance(0.1)
        if kind == "submit":
            rid = f"g{len(submitted)}"
            submitted.append(rid)
            h.submit(rid, count=1 + x % 6, seed=x, steps=2 + x, deadline_s=None if x % 3 else 2.0)
        elif kind in ("answer", "fail"):
            live = [w for w in h.work if w.batch_id in h.engine.assignments]
            if live:
                w = live[x % len(live)]
                h.answer(w) if kind == "answer" else h.answer(w, status="error", error_code="worker_error")
        elif kind == "cancel" and submitted:
            h.take(h.engine.cancel(submitted[x % len(submitted)], h.now)[1])
        elif kind == "tick":
            h.take(h.engine.tick(h.now))
        elif kind == "die":
            h.register(f"w{x % 2 + 1}", capacity=4)
    for _ in range(50):
        if not h.engine.groups:
            break
        if "w1" not in h.engine.workers and "w2" not in h.engine.workers:
            h.register("w1", capacity=4)
        h.run_all()
        h.take(h.engine.tick(h.now))
    assert not h.engine.groups
    for rid in submitted:
        assert len(h.replies.get(rid, [])) == 1, rid
    for got in h.replies.values():
        if got[0].status == "done":
            seeds = got[0].candidate_seeds
            np.testing.assert_allclose(got[0].action, reduced(seeds))


def test_engine_records_the_workers_conditioning_cache_from_heartbeats():
    from prometheus_client import CollectorRegistry

    from candidate_scheduler.service.metrics import SchedulerMetrics

    registry = CollectorRegistry()
    h = Harness()
    h.engine.metrics = SchedulerMetrics(registry)
    h.register("w1")
    h.take(h.engine.heartbeat(b"w1", Heartbeat("w1", cache={"text_hits": 3, "text_misses": 1, "vae_hits": 2,
                                                            "bytes": 4096}), h.now))
    h.take(h.engine.heartbeat(b"w1", Heartbeat("w1", cache={"text_hits": 1, "evictions": 2, "bytes": 1024}), h.now))

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    lookups = "candidate_scheduler_conditioning_cache_lookups_total"
    assert value(lookups, kind="text", result="hit") == 4 and value(lookups, kind="text", result="miss") == 1
    assert value(lookups, kind="vae", result="hit") == 2
    assert value("candidate_scheduler_conditioning_cache_evictions_total") == 2
    assert value("candidate_scheduler_conditioning_cache_bytes") == 1024


def test_engine_reject_policy_admits_what_the_largest_worker_holds_whole():
    """Under `reject` a group runs whole on one worker: it must fit the largest, not every worker."""
    h = Harness(policy="reject")
    h.register("small", capacity=4)
    h.register("large", capacity=8)
    h.submit("g", count=6)
    assert [(w.identity, [len(s.dispatch.candidate_ids) for s in w.slices]) for w in h.work] == [(b"large", [6])]
    h.run_all()
    assert h.reply("g").status == "done" and h.reply("g").metrics["admission_mode"] == "atomic"
    h.submit("too-big", count=9)
    r = h.reply("too-big")
    assert (r.status, r.error_code) == ("rejected", "does_not_fit") and "of 8 candidates" in r.error
