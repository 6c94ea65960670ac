"""An error text goes to every group it concerns, and each principal's copy names no other principal's
group (core/request_scope.redacted): a worker's error for a shared batch, an exception inside an event."""

from __future__ import annotations

from candidate_scheduler.core.messages import SliceOutcome, WorkerResult
from candidate_scheduler.core.request_scope import OTHERS, redacted
from tests.unit.test_engine import submission
from tests.unit.test_request_scopes import ALICE, BOB
from tests.unit.test_resubmission import _recording, _replies_to


def test_redacted_takes_out_other_principals_ids_only():
    text = "step failed in group 'alice/x2', beside 'alice/x' and 'bob/y'"
    assert redacted(text, "bob/y", ["alice/x", "alice/x2", "bob/y"]) == (
        f"step failed in group '{OTHERS}', beside '{OTHERS}' and 'bob/y'")
    assert redacted(text, "alice/x", ["alice/x", "alice/x2", "bob/y"]) == (
        f"step failed in group 'alice/x2', beside 'alice/x' and '{OTHERS}'")
    assert redacted("no ids here", "bob/y", ["alice/x"]) == "no ids here"


def _shared_batch(h):
    for rid, who, seed in (("x", ALICE, 1), ("y", BOB, 2)):  # both queued, then one planning pass
        h.take(h.engine.submit((who.name, rid), submission(rid, scope=who.name, count=1, seed=seed), h.now,
                               principal=who, plan=False))
    h.take(h.engine.plan(h.now))
    [send] = [w for w in h.work if w.batch_id in h.engine.assignments]
    assert {sw.dispatch.request_id for sw in send.slices} == {"alice/x", "bob/y"}  # one batch, both groups
    return send


def test_a_workers_error_for_a_shared_batch_names_no_other_principals_group():
    h = _recording()
    send = _shared_batch(h)
    error = "model raised in group 'alice/x' at step 3"
    outputs = tuple(SliceOutcome(sw.dispatch.request_id, "error", error=error, error_code="model_error")
                    for sw in send.slices)
    h.take(h.engine.worker_result(send.identity, WorkerResult("w1", send.batch_id, outputs, {}), h.now))
    [a], [b] = _replies_to(h, "alice", "x"), _replies_to(h, "bob", "y")
    assert a.status == b.status == "failed"
    assert "alice/x" in a.error and "alice" not in b.error and OTHERS in b.error


def test_an_exception_inside_an_event_names_no_other_principals_group(monkeypatch):
    h = _recording()
    send = _shared_batch(h)
    cls = type(h.engine.groups["alice/x"])
    fold = cls.fold

    def broken_fold(self, *a, **k):  # alice's fold raises, naming bob's group in the batch beside it
        if self.request_id == "alice/x":
            raise RuntimeError("fold of 'alice/x' beside 'bob/y' broke")
        return fold(self, *a, **k)

    monkeypatch.setattr(cls, "fold", broken_fold)
    h.answer(send)
    [a], [b] = _replies_to(h, "alice", "x"), _replies_to(h, "bob", "y")
    assert (a.error_code, b.status) == ("internal_error", "done")
    assert "'alice/x'" in a.error and "bob" not in a.error and OTHERS in a.error
