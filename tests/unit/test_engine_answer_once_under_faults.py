"""Exactly one answer per destination, no group left behind and no other group touched, when code inside an
event raises at an awkward moment: after a resubmission was made a waiter, after the reply went out but
before the group was forgotten, while the group was being ended, while its slices were being re-fitted
(core/engine.py, "atomic events"; core/endings.py)."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.core.messages import Reply
from candidate_scheduler.core.resubmission import ReplyCache
from tests.unit.test_engine import Harness, reduced, submission


class _RaisingOn:
    """A metrics sink whose one named call raises (a metric backend's bug); every other call is a no-op."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str):
        def call(*_args, **_kwargs):
            if attr == self.name:
                raise RuntimeError(f"injected: {attr}")
        return call


def _replies_to(sent: list, client) -> list:
    return [m.result for m in sent if isinstance(m, Reply) and m.client == client]


def test_a_resubmission_that_became_a_waiter_is_not_also_refused_when_the_event_raises():
    """The resubmission was added to the group's waiters, then the event raised: the waiter gets the
    group's one answer, not an internal_error refusal now and the group's answer later."""
    h = Harness()
    h.register("w1")
    sent: list = []

    def send(client, **kw) -> None:
        sent.extend(h.take(h.engine.submit(client, submission("g", count=2, **kw), h.now)))

    send(("first", "g"))
    h.engine.metrics = _RaisingOn("resubmission")  # raises after the waiter is recorded
    send(("again", "g"))
    send(("first", "g"))  # the original destination resending: answered once too
    h.engine.metrics = _RaisingOn("none")
    for w in [w for w in h.work if w.batch_id in h.engine.assignments]:
        sent.extend(h.answer(w))
    for client in (("first", "g"), ("again", "g")):
        got = _replies_to(sent, client)
        assert [r.status for r in got] == ["done"], (client, [(r.status, r.error_code) for r in got])


def test_a_group_whose_ending_raised_after_its_reply_went_out_is_still_forgotten(monkeypatch):
    """Keeping the reply for resubmissions raised after the reply was sent: the group is answered once
    and forgotten all the same -- not left in flight forever (counted against the limits, holding a
    graceful stop to its grace, parking its owner's resubmissions as waiters that are never answered)."""
    h = Harness()
    h.register("w1")
    real = ReplyCache.put

    def put(self, request_id, *args):
        if request_id == "g":
            raise RuntimeError("injected")
        return real(self, request_id, *args)

    monkeypatch.setattr(ReplyCache, "put", put)
    h.submit("g", count=2)
    h.run_all()
    assert h.reply("g").status == "done"
    assert "g" not in h.engine.groups and h.engine.stats()["groups_in_flight"] == 0
    assert h.engine.status("g").state == "done"
    monkeypatch.undo()
    h.submit("g", count=2, seed=5)  # the id is free again: a new group runs (nothing was kept)
    h.run_all()
    assert [r.status for r in h.replies["g"]] == ["done", "done"]


def test_the_last_resort_answer_of_a_group_whose_ending_keeps_raising_reaches_its_waiters_too(monkeypatch):
    """Ending the group raised, and raised again when the fault was answered: the plain internal_error
    answer goes to the group's sender and to every resubmission waiting on it, not to the sender alone."""
    h = Harness()
    h.register("w1")
    sent: list = []
    sent.extend(h.take(h.engine.submit(("first", "g"), submission("g", count=2), h.now)))
    sent.extend(h.take(h.engine.submit(("again", "g"), submission("g", count=2), h.now)))
    assert h.engine.groups["g"].waiters == [("again", "g")]
    real = type(h.engine).worker_of

    def worker_of(self, worker_id):  # the ending looks up the workers running the group's slices
        if worker_id == "w1":
            raise RuntimeError("injected")
        return real(self, worker_id)

    monkeypatch.setattr(type(h.engine), "worker_of", worker_of)
    _, out = h.engine.cancel("g", h.now)
    sent.extend(h.take(out))
    monkeypatch.undo()
    for client in (("first", "g"), ("again", "g")):
        got = _replies_to(sent, client)
        assert [(r.status, r.error_code) for r in got] == [("failed", "internal_error")], client
    assert "g" not in h.engine.groups


def test_a_fault_while_refitting_one_groups_slices_fails_that_group_and_loses_no_other(monkeypatch):
    """The worker ran out of memory and holds fewer rows: the planning pass halves the pending slices no
    worker can hold any more. Code that raised while re-indexing one group's halves left that group with
    slices in no queue -- never run, never answered -- and stopped the pass for everyone else."""
    from candidate_scheduler.core.pending import PendingIndex

    h = Harness()
    h.register("w1", capacity=8)
    h.submit("blocker", count=8, seed=1)
    h.submit("bad", count=8, seed=2)  # one slice of 8 each, waiting for the worker
    h.submit("ok", count=8, seed=3)
    real = PendingIndex.add

    def add(self, unit):
        if unit.request_id == "bad" and unit.size < 8:  # its halves, as the pass re-indexes them
            raise RuntimeError("injected")
        return real(self, unit)

    monkeypatch.setattr(PendingIndex, "add", add)
    h.answer(h.work[0], status="error", error_code="out_of_memory", report={"oom_rows": 8})  # 7 rows now
    r = h.reply("bad")
    assert r.status == "failed" and r.error_code == "internal_error" and "injected" in r.error
    monkeypatch.undo()
    h.run_all()
    assert h.reply("blocker").status == "done" and h.reply("ok").status == "done"
    assert not h.engine.groups


def test_after_a_last_resort_answer_the_groups_late_results_never_reach_a_new_group_with_its_id(monkeypatch):
    """The last-resort answer forgot the group without marking its slices still out as cancelled: the old
    slice's late result was then taken for the slice of a new group under the same id running on that
    worker -- the new group answered `done` with the old group's candidates under its own seeds."""
    h = Harness(batching="step", replies_kept=0)
    h.register("w1", capacity=8)
    h.submit("g", count=2, seed=1)
    old = h.work[0]
    real = type(h.engine).worker_of

    def worker_of(self, worker_id):
        if worker_id == "w1":
            raise RuntimeError("injected")
        return real(self, worker_id)

    monkeypatch.setattr(type(h.engine), "worker_of", worker_of)
    h.take(h.engine.cancel("g", h.now)[1])
    monkeypatch.undo()
    assert h.reply("g").error_code == "internal_error"
    h.replies.clear()
    h.submit("g", count=2, seed=2)  # the id again: it joins the same worker's running batch
    new = h.work[-1]
    assert new.batch_id != old.batch_id and new.identity == old.identity
    h.answer(old)  # the old slice's result, late
    h.answer(new)
    r = h.reply("g")
    assert r.status == "done" and tuple(r.candidate_seeds) == tuple(new.slices[0].dispatch.seeds)
    np.testing.assert_allclose(r.action, reduced(r.candidate_seeds))
