"""Each principal's request ids are its own (core/request_scope.py): two principals may use one id at
once, and neither's group, refusal or kept reply touches the other's; cancel and status reach another's
group only by naming its namespace, where the rights still apply."""

from __future__ import annotations

from candidate_scheduler.core.access import FORBIDDEN, Principal, Role
from candidate_scheduler.core.request_scope import scoped_id
from candidate_scheduler.core.spec import MAX_REQUEST_ID_LEN
from tests.unit.test_engine import Harness, submission
from tests.unit.test_resubmission import _recording, _replies_to

ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "robots", Role.CLIENT)
FRONT = Principal("front", "default", Role.PROXY)
ADMIN = Principal("ops", "default", Role.ADMIN)


def _send(h, rid: str, principal: Principal, client: str, scope: str | None = None, **kw) -> None:
    sub = submission(rid, scope=principal.name if scope is None else scope, **kw)
    h.take(h.engine.submit((client, rid), sub, h.now, principal=principal,
                           via=None if scope is None or scope == principal.name else scope))


def test_two_principals_run_the_same_id_at_once_each_its_own_group():
    h = _recording()
    _send(h, "episode-3", ALICE, "alice", count=2, seed=11)
    _send(h, "episode-3", BOB, "bob", count=2, seed=22)
    assert set(h.engine.groups) == {"alice/episode-3", "bob/episode-3"}
    h.run_all()
    [a], [b] = _replies_to(h, "alice", "episode-3"), _replies_to(h, "bob", "episode-3")
    assert a.status == b.status == "done"
    assert a.candidate_seeds[0] == 11 and b.candidate_seeds[0] == 22  # each its own request's


def test_another_principal_reusing_an_ended_id_leaves_the_owners_kept_reply_alone():
    h = _recording()
    _send(h, "g", ALICE, "alice", count=2, seed=11)
    h.run_all()
    _send(h, "g", BOB, "bob", count=2, seed=22)  # after alice's ended: a group of bob's own, run
    h.run_all()
    [bobs] = _replies_to(h, "bob", "g")
    assert bobs.status == "done" and bobs.candidate_seeds[0] == 22
    work = len(h.work)
    _send(h, "g", ALICE, "alice-again", count=2, seed=11)  # her resubmission: answered, not run again
    [again] = _replies_to(h, "alice-again", "g")
    [first] = _replies_to(h, "alice", "g")
    assert again is first and len(h.work) == work


def test_the_id_limit_is_the_clients_own_whatever_its_principals_name():
    h = _recording()
    long_name = Principal("p" * 64, "robots", Role.CLIENT)
    _send(h, "x" * MAX_REQUEST_ID_LEN, long_name, "ok")
    assert scoped_id(long_name.name, "x" * MAX_REQUEST_ID_LEN) in h.engine.groups
    _send(h, "y" * (MAX_REQUEST_ID_LEN + 1), long_name, "long")
    [r] = _replies_to(h, "long", "y" * (MAX_REQUEST_ID_LEN + 1))
    assert (r.status, r.error_code) == ("invalid", "invalid_value")


def test_cancel_and_status_reach_a_group_by_its_namespace_and_the_rights_still_hold():
    h = _recording()
    _send(h, "g", ALICE, "alice", steps=40)
    assert h.engine.status("bob/g", BOB).state == "unknown"  # bob's own "g": nobody's
    assert h.engine.status("alice/g", BOB).error_code == FORBIDDEN
    answer, _ = h.engine.cancel("alice/g", h.now, BOB)
    assert answer.error_code == FORBIDDEN and h.engine.status("alice/g", ALICE).state in ("admitted", "running")
    assert h.engine.status("alice/g", ADMIN).state in ("admitted", "running")
    answer, out = h.engine.cancel("alice/g", h.now, ADMIN)
    h.take(out)
    assert answer.changed and _replies_to(h, "alice", "g")[0].status == "cancelled"


def test_a_proxys_groups_live_in_its_namespace_where_it_and_the_client_it_acted_for_reach_them():
    h = _recording()
    _send(h, "call-1", ALICE, "front", scope=FRONT.name, steps=40)  # the front, acting for alice
    assert set(h.engine.groups) == {"front/call-1"}
    assert h.engine.status("front/call-1", ALICE).state in ("admitted", "running")
    assert h.engine.status("front/call-1", BOB).error_code == FORBIDDEN
    answer, out = h.engine.cancel("front/call-1", h.now, FRONT)
    h.take(out)
    assert answer.changed and _replies_to(h, "front", "call-1")[0].status == "cancelled"


def test_a_reused_ids_owners_are_remembered_as_long_as_its_state():
    """STATUS of an ended group stays its owners' after the id is used again and older ones are forgotten."""
    h = Harness(finished_memory=2, replies_kept=0)  # no kept reply: the same id runs again
    h.register("w1")
    for rid, seed in (("x", 1), ("y", 2), ("x", 3), ("z", 4)):
        h.take(h.engine.submit((f"alice-{seed}", rid), submission(rid, seed=seed, scope="alice"), h.now,
                               principal=ALICE))
        h.run_all()
    assert h.engine.status("alice/x", ALICE).state == "done"
    assert h.engine.status("alice/x", BOB).error_code == FORBIDDEN
