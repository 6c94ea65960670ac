"""A worker that leaves gracefully (core/worker_link.py, "Leaving"): no new work from the moment it says
so, what it owes listed back to it, its answers folded as usual, forgotten at once when it has gone;
what it could not finish retried elsewhere. Exactly one reply per group throughout."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from candidate_scheduler.core.messages import AckLeaving, GiveBack, Leaving, Left, StopWorker
from candidate_scheduler.service.metrics import SchedulerMetrics
from tests.unit.test_engine import Harness, reduced


class Counted:
    """The scheduler's own metrics on the engine; the worker departures and failures it counted."""

    def __init__(self, h: Harness):
        self.registry = CollectorRegistry()
        h.engine.metrics = SchedulerMetrics(self.registry)

    def of(self, name: str) -> dict[str, float]:
        """{label value: count} of one labelled counter, nonzero ones."""
        family = next(f for f in self.registry.collect() if f.name == f"candidate_scheduler_{name}")
        return {next(iter(s.labels.values())): s.value for s in family.samples
                if s.name.endswith("_total") and s.value}

    def total(self, name: str) -> float:
        """The value of an unlabelled counter."""
        family = next(f for f in self.registry.collect() if f.name == f"candidate_scheduler_{name}")
        return next(s.value for s in family.samples if s.name.endswith("_total"))


def leaving(h: Harness, worker_id: str, grace_s: float = 30.0) -> list:
    return h.take(h.engine.worker_leaving(worker_id.encode(), Leaving(worker_id, grace_s), h.now))


def left(h: Harness, worker_id: str, reason: str = "finished") -> list:
    return h.take(h.engine.worker_left(worker_id.encode(), Left(worker_id, reason), h.now))


def leaving_with_a_group(count: int):
    """Worker "a" of `count` rows running group "g", then leaving: (harness, its assignment)."""
    h = Harness()
    h.register("a", capacity=count)
    h.submit("g", count=count, seed=count)
    (send,) = h.work
    leaving(h, "a")
    return h, send


def on(h: Harness, worker_id: str) -> list:
    """Assignments sent to `worker_id` that are still out."""
    return [w for w in h.work if w.identity == worker_id.encode() and w.batch_id in h.engine.assignments]


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_a_leaving_worker_gets_no_new_work_finishes_what_it_owes_and_is_forgotten(batching):
    h = Harness(batching=batching)
    metrics = Counted(h)
    h.register("a", capacity=2)
    for i in range(4):
        h.submit(f"g{i}", count=1, seed=10 + i)
    owed = on(h, "a")
    assert owed  # it holds work when it is told to go
    (ack,) = [m for m in leaving(h, "a") if isinstance(m, AckLeaving)]
    assert set(ack.batch_ids) == {w.batch_id for w in owed}
    assert "a" not in h.engine.workers and "a" in h.engine.leaving
    assert h.engine.stats()["leaving"] == {"a": {"assignments": len(owed)}}
    sent_before = len(h.work)
    for w in owed:  # its answers are folded; nothing new goes to it, though it frees rows
        h.answer(w)
    assert len(h.work) == sent_before and not on(h, "a")
    assert h.engine.stats()["leaving"] == {"a": {"assignments": 0}}  # its rows were given back
    assert not [m for m in left(h, "a") if isinstance(m, StopWorker)]
    assert metrics.of("worker_departures") == {"finished": 1.0} and metrics.of("worker_failures") == {}
    assert "a" not in h.engine.leaving and "a" not in h.engine.workers
    h.register("b", capacity=2)  # the rest run on a worker that joins later
    h.run_all()
    for i in range(4):
        r = h.reply(f"g{i}")
        assert r.status == "done" and r.metrics["retries"] == 0
        np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))
    assert {w.identity for w in h.work[sent_before:]} == {b"b"}


def test_work_a_worker_could_not_finish_is_retried_elsewhere_at_once():
    h = Harness()
    metrics = Counted(h)
    h.register("a", capacity=4)
    h.register("b", capacity=4)
    h.submit("g", count=4, seed=3)
    (send,) = h.work
    gone = send.identity.decode()
    other = "b" if gone == "a" else "a"
    leaving(h, gone)
    left(h, gone, "grace_expired")  # its grace ran out with the group still running
    assert gone not in h.engine.leaving and gone not in h.engine.workers
    assert metrics.of("worker_departures") == {"unfinished": 1.0}
    assert metrics.of("worker_failures") == {"left_unfinished": 1.0} == metrics.of("retries")
    (retry,) = on(h, other)
    h.answer(retry)
    r = h.reply("g")
    assert r.status == "done" and r.metrics["retries"] == 1
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))


def test_a_result_after_the_worker_left_unfinished_is_late_and_the_group_answers_once():
    h, send = leaving_with_a_group(count=4)
    left(h, "a", "grace_expired")
    h.answer(send)  # sent as the grace ran out, it crossed LEFT on the wire: the assignment is no longer its
    assert "g" not in h.replies and h.engine.stats()["late_results_discarded"] == 1
    h.register("b", capacity=4)
    h.run_all()
    assert h.reply("g").status == "done"


def test_leaving_is_idempotent_and_a_stranger_is_asked_to_register():
    h = Harness()
    h.register("a")
    h.submit("g", count=2, seed=1)
    first = [m for m in leaving(h, "a") if isinstance(m, AckLeaving)]
    again = [m for m in leaving(h, "a") if isinstance(m, AckLeaving)]
    assert first == again and len(first) == 1
    assert [m.reason for m in leaving(h, "nobody") if isinstance(m, StopWorker)] == ["reregister"]
    assert left(h, "nobody") == []  # a LEFT from a worker we do not know: nothing to do, nobody to tell
    impostor = h.take(h.engine.worker_left(b"elsewhere", Left("a", "finished"), h.now))
    assert impostor == [] and "a" in h.engine.leaving  # its id from another connection: not its word


def test_a_worker_that_registers_again_under_a_leaving_id_is_a_new_one_and_the_old_work_is_retried():
    h, old = leaving_with_a_group(count=2)
    h.register("a", capacity=2)  # the process restarted under the same id before it said LEFT
    assert "a" in h.engine.workers and "a" not in h.engine.leaving
    (again,) = on(h, "a")
    assert again.batch_id != old.batch_id
    h.answer(old)  # the old incarnation's answer is not taken
    h.answer(again)
    assert h.reply("g").status == "done" and h.reply("g").metrics["retries"] == 1


def test_a_leaving_worker_that_goes_silent_is_lost_and_its_work_retried():
    h = Harness(heartbeat_timeout_s=1.0)
    h.register("a")
    h.submit("g", count=2, seed=1)
    leaving(h, "a")
    h.advance(2.0)
    h.take(h.engine.tick(h.now))
    assert "a" not in h.engine.leaving
    h.register("b")
    h.run_all()
    assert h.reply("g").status == "done" and h.reply("g").metrics["retries"] == 1


def test_a_cancel_reaches_a_leaving_worker_and_shutdown_tells_it_to_go():
    h = Harness()
    h.register("a")
    h.submit("g", count=2, seed=1)
    leaving(h, "a")
    h.register("b")  # registered, not leaving: told nothing (it finds the next run by its heartbeats)
    answer, out = h.engine.cancel("g", h.now)
    h.take(out)
    assert answer.changed and [c.identity for c in h.cancels] == [b"a"]
    assert h.reply("g").status == "cancelled"
    stops = [m for m in h.engine.shutdown(h.now) if isinstance(m, StopWorker)]
    assert [(s.identity, s.reason) for s in stops] == [(b"a", "reregister")]


def test_groups_wait_while_the_only_worker_leaves_and_run_when_another_comes():
    h = Harness()
    h.register("a", capacity=1)
    h.submit("first", count=1, seed=1)
    leaving(h, "a")
    h.submit("later", count=1, seed=2)  # no live worker: it waits, as before any worker registered
    assert len(h.work) == 1
    h.answer(h.work[0])
    left(h, "a")
    h.register("b", capacity=1)
    h.run_all()
    assert h.reply("first").status == "done" and h.reply("later").status == "done"
    assert h.work[-1].identity == b"b"


def test_an_operator_asks_a_worker_to_leave_and_it_leaves_as_on_sigterm():
    h = Harness()
    h.register("a", capacity=2)
    h.register("b", capacity=2)
    h.submit("g", count=2, seed=6)
    (send,) = h.work
    wid = send.identity.decode()
    answer, out = h.engine.worker_leave(wid, h.now)
    assert answer.ok and answer.changed and answer.state == "leaving" and answer.detail == {"assignments": 1}
    assert [(m.identity, m.reason) for m in out if isinstance(m, StopWorker)] == [(send.identity, "leave")]
    assert wid in h.engine.leaving and wid not in h.engine.workers
    again, out = h.engine.worker_leave(wid, h.now)  # asked twice: nothing more to tell it
    assert again.ok and not again.changed and out == []
    (ack,) = [m for m in leaving(h, wid) if isinstance(m, AckLeaving)]  # the worker says LEAVING: told what it owes
    assert ack.batch_ids == (send.batch_id,)
    h.submit("later", count=2, seed=7)
    assert {w.identity for w in h.work[1:]} == {b"b" if wid == "a" else b"a"}  # nothing new goes to it
    h.answer(send)
    left(h, wid)
    h.run_all()
    assert h.reply("g").status == "done" and h.reply("g").metrics["retries"] == 0
    assert h.reply("later").status == "done"
    unknown, out = h.engine.worker_leave("nobody", h.now)
    assert not unknown.ok and unknown.error_code == "unknown_worker" and out == []


def test_an_operators_leave_is_asked_again_at_each_heartbeat_until_the_worker_says_leaving():
    h = Harness()
    h.register("a")
    h.engine.worker_leave("a", h.now)  # its StopWorker may be lost on the link (a reconnect)
    asked = [m for m in h.beat("a") if isinstance(m, StopWorker)]
    assert [(m.identity, m.reason) for m in asked] == [(b"a", "leave")]
    leaving(h, "a")
    assert not [m for m in h.beat("a") if isinstance(m, StopWorker)]  # it said so: not asked again


def test_what_a_leaving_worker_gives_back_runs_elsewhere_at_once():
    """Prefetched work it had not started: sent now to another worker (counted as given back, not as a
    retry or an attempt: nothing ran), not after what it runs; what it runs it still answers. A
    give-back from another connection, of an assignment not its own, or from a worker that is not leaving,
    changes nothing."""
    h = Harness(prefetch=1, retry_limit=1)  # one attempt a slice: a give-back must not use it up
    metrics = Counted(h)
    h.register("a", capacity=1)
    h.submit("running", count=1, seed=1)
    h.submit("prefetched", count=1, seed=2)  # sent ahead: it waits on "a" for its row
    running, prefetched = on(h, "a")
    leaving(h, "a")
    h.register("b", capacity=1)
    assert on(h, "b") == []
    h.take(h.engine.worker_gave_back(b"intruder", GiveBack("a", (prefetched.batch_id,)), h.now))
    h.take(h.engine.worker_gave_back(b"a", GiveBack("a", (running.batch_id + 1000,)), h.now))
    assert on(h, "a") == [running, prefetched] and on(h, "b") == []
    h.take(h.engine.worker_gave_back(b"a", GiveBack("a", (prefetched.batch_id,)), h.now))
    (moved,) = on(h, "b")
    assert [s.dispatch.request_id for s in moved.slices] == ["prefetched"] and on(h, "a") == [running]
    h.take(h.engine.worker_gave_back(b"a", GiveBack("a", (moved.batch_id,)), h.now))  # not its own
    h.take(h.engine.worker_gave_back(b"b", GiveBack("b", (moved.batch_id,)), h.now))  # "b" is not leaving
    assert on(h, "b") == [moved]
    assert metrics.of("retries") == {} and metrics.total("slices_given_back") == 1
    h.answer(running)
    h.answer(moved)
    left(h, "a")
    for rid in ("running", "prefetched"):  # once each, exact: the retry ran from the same seed
        r = h.reply(rid)
        assert r.status == "done" and np.array_equal(r.action, reduced(r.candidate_seeds))
        assert r.metrics["retries"] == 0  # nothing ran twice
    assert metrics.of("worker_departures") == {"finished": 1}


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_a_slice_put_back_with_no_live_worker_is_split_for_the_next_one(batching):
    """w1 (8 rows) runs an 8-candidate slice and leaves; a 2-row replacement comes and goes; w1 leaves
    unfinished, so the slice goes back with no live worker -- whole. A 4-row worker then comes: the slice
    must be split for it (it was not: the last fit had been to 2 rows, and 4 is not less than 2)."""
    h = Harness(batching=batching)
    h.register("w1", capacity=8)
    h.submit("g", count=8, seed=3)
    leaving(h, "w1")
    h.register("w2", capacity=2)
    h.submit("h", count=2, seed=4)
    leaving(h, "w2")
    left(h, "w1", "grace_expired")
    h.register("w3", capacity=4)
    h.run_all()
    r = h.reply("g")
    assert r.status == "done" and np.array_equal(r.action, reduced(r.candidate_seeds))
