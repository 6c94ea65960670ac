"""Resubmitting a request id (core/resubmission.py): the owner's resubmission of a group in flight
waits for its one answer, of an ended group is answered from the kept replies; the group never runs
twice; anyone else's submission under that id is refused without revealing anything."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.core.access import Principal, Role
from candidate_scheduler.core.resubmission import MAX_WAITERS, ReplyCache
from tests.unit.test_engine import Harness, submission

ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "robots", Role.CLIENT)


def _recording() -> Harness:
    """A harness with one worker that also keeps every message sent, in order (replies by client)."""
    h = Harness()
    h.sent = []
    h.take = lambda out: (h.sent.extend(out), Harness.take(h, out))[1]
    h.register("w1")
    return h


def _send(h: Harness, rid: str, principal: Principal, client: str, **kw) -> None:
    h.take(h.engine.submit((client, rid), submission(rid, **kw), h.now, principal=principal))


def _replies_to(h: Harness, client: str, rid: str) -> list:
    return [m.result for m in h.sent if getattr(m, "client", None) == (client, rid)]


def test_a_resubmission_in_flight_waits_for_the_one_answer_and_the_group_runs_once():
    h = _recording()
    _send(h, "g", ALICE, "first", count=3)
    _send(h, "g", ALICE, "again", count=3)  # e.g. after a reconnect
    batches = [w for w in h.work if any(s.dispatch.request_id == "g" for s in w.slices)]
    assert len(batches) == 1 and h.engine.metrics is not None
    h.run_all()
    first, again = _replies_to(h, "first", "g"), _replies_to(h, "again", "g")
    assert len(first) == 1 and len(again) == 1 and first[0] is again[0] and first[0].status == "done"
    assert len([w for w in h.work if any(s.dispatch.request_id == "g" for s in w.slices)]) == 1


def test_a_resubmission_of_an_ended_group_is_answered_from_the_kept_replies():
    h = _recording()
    _send(h, "g", ALICE, "first", count=2)
    h.run_all()
    work_before = len(h.work)
    _send(h, "g", ALICE, "later", count=2)
    [later] = _replies_to(h, "later", "g")
    [first] = _replies_to(h, "first", "g")
    assert later is first and later.status == "done"
    assert len(h.work) == work_before  # answered, not run again


def test_another_principal_under_the_same_id_is_refused_and_learns_nothing():
    h = _recording()
    _send(h, "g", ALICE, "alice", count=2)
    _send(h, "g", BOB, "bob", count=2)
    [refused] = _replies_to(h, "bob", "g")
    assert refused.status == "invalid" and refused.error_code == "duplicate_request_id"
    h.run_all()
    _send(h, "g", BOB, "bob-later", count=2)  # ended: bob is not an owner, so no kept reply for him
    assert not _replies_to(h, "bob-later", "g")
    h.run_all()
    [r] = _replies_to(h, "bob-later", "g")
    assert r.status == "done" and r.candidate_seeds  # a fresh group of his own, run
    assert len(_replies_to(h, "alice", "g")) == 1


def test_the_kept_replies_are_bounded_and_only_for_their_owners():
    cache = ReplyCache(2)
    for i in range(3):
        cache.put(f"r{i}", ("alice",), b"fp", i)
    assert len(cache) == 2 and cache.get("r0", "alice") is None
    assert cache.get("r2", "alice") == (b"fp", 2) and cache.get("r2", "bob") is None
    off = ReplyCache(0)
    off.put("x", ("alice",), None, 1)
    assert off.get("x", "alice") is None


def test_the_kept_replies_are_bounded_by_the_bytes_of_their_arrays():
    """1,024 replies with candidates or rollouts could weigh gigabytes: the oldest go past the byte bound
    (replaced replies counted once)."""
    from candidate_scheduler.core.messages import GroupResult

    def reply(rid: str, floats: int) -> GroupResult:
        return GroupResult(rid, "done", action=np.zeros(floats, np.float32),
                           rollout={"latents": np.zeros(floats, np.float32)})

    cache = ReplyCache(100, max_bytes=3 * 800)  # three replies of 100 + 100 floats
    for i in range(4):
        cache.put(f"r{i}", ("alice",), None, reply(f"r{i}", 100))
    assert len(cache) == 3 and cache.bytes == 2400 and cache.get("r0", "alice") is None
    cache.put("r3", ("alice",), None, reply("r3", 100))  # the same id again: not counted twice
    assert len(cache) == 3 and cache.bytes == 2400 and cache.get("r1", "alice") is not None
    cache.put("huge", ("alice",), None, reply("huge", 1000))  # alone over the bound: nothing kept
    assert len(cache) == 0 and cache.bytes == 0


def test_an_id_reused_for_a_different_request_is_refused_in_flight_and_after():
    h = _recording()

    def send(rid: str, client: str, fingerprint: bytes, **kw) -> None:
        h.take(h.engine.submit((client, rid), submission(rid, **kw), h.now, principal=ALICE,
                               fingerprint=fingerprint))

    send("g", "first", b"one", count=2, seed=1)
    send("g", "changed", b"two", count=2, seed=2)  # same id, other content: not a resubmission
    [refused] = _replies_to(h, "changed", "g")
    assert refused.status == "invalid" and refused.error_code == "duplicate_request_id"
    send("g", "same", b"one", count=2, seed=1)
    h.run_all()
    assert _replies_to(h, "same", "g")[0] is _replies_to(h, "first", "g")[0]
    send("g", "changed-later", b"three", count=2, seed=3)
    [later] = _replies_to(h, "changed-later", "g")
    assert later.error_code == "duplicate_request_id" and "different request" in later.error
    send("g", "same-later", b"one", count=2, seed=1)
    assert _replies_to(h, "same-later", "g")[0] is _replies_to(h, "first", "g")[0]


def test_a_stopping_scheduler_still_answers_resubmissions_and_refuses_new_groups_stopping():
    """What makes a resubmitting client's resend safe while the scheduler stops: the group it still holds
    takes the resend as a waiter, the one it answered answers it again; only a new id is refused, and
    `stopping` (send it to the next run), not an operator's `draining`."""
    h = _recording()

    def send(rid: str, client: str, fingerprint: bytes, **kw) -> None:
        h.take(h.engine.submit((client, rid), submission(rid, **kw), h.now, principal=ALICE,
                               fingerprint=fingerprint))

    send("done", "first", b"done", count=2, seed=2)
    h.run_all()
    send("held", "first", b"held", count=2, seed=1)  # running when the stop comes
    h.engine.draining = h.engine.stopping = True  # what the shell sets when it stops (service/server.py)
    assert h.engine.stats()["stopping"]
    send("held", "again", b"held", count=2, seed=1)
    send("done", "again", b"done", count=2, seed=2)
    send("new", "again", b"new", count=2, seed=3)
    assert _replies_to(h, "again", "held") == []  # a waiter: answered with the group, once
    assert _replies_to(h, "again", "done")[0] is _replies_to(h, "first", "done")[0]
    [refused] = _replies_to(h, "again", "new")
    assert (refused.status, refused.error_code) == ("rejected", "stopping")
    h.run_all()
    assert _replies_to(h, "again", "held")[0] is _replies_to(h, "first", "held")[0]
    h.engine.stopping = False  # an operator's drain alone
    send("other", "again", b"other", count=2, seed=4)
    assert _replies_to(h, "again", "other")[0].error_code == "draining"


def test_the_leftovers_of_an_ended_group_never_touch_a_new_group_under_its_id():
    """An ended group's slice still out on a worker (cancelled there, unanswered), its id then reused (by
    another principal, or once its kept reply is gone): when that worker is lost, or gives the slice back,
    the slice was failed or returned by request id -- the new group's. It was answered internal_error."""
    from candidate_scheduler.core.messages import GiveBack, Leaving

    h = Harness(replies_kept=0)  # nothing kept: the id runs again, as once its reply is evicted
    h.register("w1", capacity=2)
    h.register("w2", capacity=2)
    h.submit("r", count=4, seed=1)  # slices 0 and 1: one on each worker
    on_w1 = next(w for w in h.work if w.identity == b"w1")
    h.take(h.engine.cancel("r", h.now)[1])
    h.replies.clear()
    h.answer(on_w1, status="cancelled")
    h.submit("r", count=1, seed=2)  # a new group, one slice, on w1
    h.advance(h.engine.config.heartbeat_timeout_s + 1)  # w2 never answers and goes silent: lost
    h.beat("w1", running=[w.batch_id for w in h.work if w.identity == b"w1" and w.batch_id in h.engine.assignments])
    h.take(h.engine.tick(h.now))
    assert "r" not in h.replies
    h.run_all()
    assert h.reply("r").status == "done" and h.reply("r").candidate_seeds == (2,)

    g = Harness(replies_kept=0, prefetch=1)
    g.register("a", capacity=2)
    g.submit("r", count=4, seed=1)  # slice 0 runs on "a", slice 1 is sent ahead and waits there
    g.take(g.engine.plan(g.now))
    waiting = g.work[1]
    g.take(g.engine.cancel("r", g.now)[1])
    g.replies.clear()
    g.take(g.engine.worker_leaving(b"a", Leaving("a", 30.0), g.now))
    g.register("b", capacity=2)
    g.submit("r", count=1, seed=2)
    g.take(g.engine.worker_gave_back(b"a", GiveBack("a", (waiting.batch_id,)), g.now))
    assert "r" not in g.replies
    g.run_all()
    assert g.reply("r").status == "done"


def test_resubmissions_from_the_destination_already_waiting_add_no_second_reply():
    """A client resending on the connection it sent from (a drop it took for a lost reply, or a retry
    loop) is one destination: it gets one reply, however often it resends, and nothing piles up."""
    h = _recording()
    _send(h, "g", ALICE, "first", count=3)
    for _ in range(5):
        _send(h, "g", ALICE, "first", count=3)
        _send(h, "g", ALICE, "again", count=3)
    assert len(h.engine.groups["g"].waiters) == 1
    h.run_all()
    assert len(_replies_to(h, "first", "g")) == 1 and len(_replies_to(h, "again", "g")) == 1


def test_a_group_behind_a_flapping_link_keeps_its_newest_waiters_only():
    """Each reconnect resubmits from a new connection: the newest MAX_WAITERS of them and the sender are
    answered, the older ones (gone, nearly always) are forgotten instead of piling up."""
    h = _recording()
    _send(h, "g", ALICE, "sender", count=3)
    for i in range(3 * MAX_WAITERS):
        _send(h, "g", ALICE, f"reconnect{i}", count=3)
    assert len(h.engine.groups["g"].waiters) == MAX_WAITERS
    h.run_all()
    answered = [i for i in range(3 * MAX_WAITERS) if _replies_to(h, f"reconnect{i}", "g")]
    assert answered == list(range(2 * MAX_WAITERS, 3 * MAX_WAITERS))
    assert len(_replies_to(h, "sender", "g")) == 1


def test_the_shell_treats_two_submits_from_one_connection_as_one_destination():
    from candidate_scheduler.service.server import ClientRef
    assert ClientRef(b"id", False, 1.0) == ClientRef(b"id", False, 2.0)
    assert ClientRef(b"id", False, 1.0) != ClientRef(b"other", False, 1.0)
    assert ClientRef(b"id", False) != ClientRef(b"id", True)


def test_an_id_that_ends_again_is_remembered_as_the_newest():
    """STATUS remembers the last `finished_memory` ends; an id that ended again (here its kept reply was not
    kept, so its resubmission ran again) was updated in place and forgotten first, before older ends."""
    h = Harness(finished_memory=2, replies_kept=0)
    h.register("w1")
    for rid in ("a", "b", "a", "c"):
        h.submit(rid, count=1)
        h.answer(h.work[-1])
    assert h.engine.status("a").state == "done"  # "b" ended before "a" did the second time: "b" goes
    assert h.engine.status("b").state == "unknown"
