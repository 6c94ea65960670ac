"""The shell's side of per-principal request ids (core/request_scope.py), on a keyed Scheduler whose sockets
are recorders: every reply a client gets -- its group's, a refusal, a resubmission's, a shutdown's, a
reply_too_large -- carries the id it sent, never the engine's scoped one; and CANCEL/STATUS's `principal`
must name a principal, not a path into another request id."""

from __future__ import annotations

import msgspec
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.core.access import Principal, Role
from candidate_scheduler.service.requests import make_request, synthetic_image
from candidate_scheduler.service.server import Scheduler, SchedulerConfig

IMAGE = synthetic_image()
ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "robots", Role.CLIENT)
FRONT = Principal("front", "default", Role.PROXY)
ADMIN = Principal("ops", "default", Role.ADMIN)


class _Recorder:
    def __init__(self):
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames, **_kw) -> None:
        self.sent.append(list(frames))


class _Tokens:
    """The key directory's token holders, as acting_for looks them up."""

    def token_holder(self, name: str):
        return {p.name: p for p in (ALICE, BOB)}.get(name)


@pytest.fixture
def shell():
    sched = Scheduler(SchedulerConfig(metrics_port=None))
    sched._authenticator = object()  # `secure`: every client message names its principal
    sched.directory = _Tokens()
    sched.request_sock, sched.control_sock, sched.worker_sock = _Recorder(), _Recorder(), _Recorder()
    try:
        yield sched
    finally:
        sched.ctx.destroy(linger=0)


def _submit(sched, identity: bytes, sender: Principal, rid: str, **kw) -> None:
    req = make_request(IMAGE, "pick", count=kw.pop("count", 2), steps=kw.pop("steps", 40), **kw)
    req = msgspec.structs.replace(req, request_id=rid)  # as sent, even an id make_request would replace
    sched._on_request([identity, *protocol.encode(protocol.Kind.SUBMIT, req)], sender)


def _replies(sched) -> dict[bytes, list[protocol.GroupResult]]:
    out: dict[bytes, list] = {}
    for frames in sched.request_sock.sent:
        _kind, result = protocol.decode_frames(frames[1:], {protocol.Kind.RESULT})
        out.setdefault(frames[0], []).append(result)
    return out


def _control(sched, kind: protocol.Kind, msg, principal: Principal) -> protocol.ControlReply:
    before = len(sched.control_sock.sent)
    sched._on_control([b"ctl", *protocol.encode(kind, msg)], principal)
    [frames] = sched.control_sock.sent[before:]
    return protocol.decode_frames(frames[1:], {protocol.Kind.CONTROL_REPLY})[1]


def test_every_reply_path_carries_the_id_the_client_sent(shell, monkeypatch):
    _submit(shell, b"a1", ALICE, "g")
    _submit(shell, b"b1", BOB, "g")  # bob's own "g": a group of its own, not a duplicate
    assert set(shell.engine.groups) == {"alice/g", "bob/g"}
    _submit(shell, b"a2", ALICE, "g")  # alice's resubmission from another connection: waits on her group
    _submit(shell, b"a3", ALICE, "g", seed=7)  # another request under her id: refused
    _submit(shell, b"a4", ALICE, "")  # an unreadable id
    _submit(shell, b"f1", FRONT, "call-1", on_behalf="alice")  # a proxy's group, in its namespace
    assert "front/call-1" in shell.engine.groups
    refused = _replies(shell)
    assert [(r.request_id, r.error_code) for r in refused[b"a3"]] == [("g", "duplicate_request_id")]
    assert "alice" not in refused[b"a3"][0].error
    assert [r.request_id for r in refused[b"a4"]] == [""]

    shell.engine.draining = True
    _submit(shell, b"b2", BOB, "h")
    assert [(r.request_id, r.error_code) for r in _replies(shell)[b"b2"]] == [("h", "draining")]

    monkeypatch.setattr(protocol, "MAX_MESSAGE_BYTES", 64)  # every reply now too large: the typed refusal
    shell._send_all(shell.engine.shutdown(0.0))
    monkeypatch.undo()  # the refusals are sent whatever their size; read back under the real limit
    replies = _replies(shell)
    for identity, rid in ((b"a1", "g"), (b"a2", "g"), (b"b1", "g"), (b"f1", "call-1")):
        [r] = replies[identity]
        assert (r.request_id, r.error_code) == (rid, "reply_too_large"), identity


def test_a_reply_that_cannot_be_encoded_falls_back_under_the_clients_id(shell, monkeypatch):
    _submit(shell, b"a1", ALICE, "g")
    real = protocol.reply_frames
    calls = []

    def once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise OverflowError("planted")
        return real(*args)

    monkeypatch.setattr(protocol, "reply_frames", once)
    shell._send_all(shell.engine.shutdown(0.0))
    [r] = _replies(shell)[b"a1"]
    assert (r.request_id, r.error_code) == ("g", "internal_error")


def test_cancel_and_status_look_in_the_senders_namespace_and_an_admin_names_anothers(shell):
    _submit(shell, b"a1", ALICE, "g")
    _submit(shell, b"f1", FRONT, "call-1", on_behalf="bob")
    assert _control(shell, protocol.Kind.STATUS, protocol.StatusRequest("g"), ALICE).state in ("queued", "admitted")
    assert _control(shell, protocol.Kind.STATUS, protocol.StatusRequest("g"), BOB).state == "unknown"
    assert _control(shell, protocol.Kind.STATUS, protocol.StatusRequest("g", "alice"), BOB).error_code == "forbidden"
    # the client a proxy acted for reaches that group in the proxy's namespace; another client does not
    assert _control(shell, protocol.Kind.STATUS, protocol.StatusRequest("call-1", "front"), BOB).ok
    assert _control(shell, protocol.Kind.CANCEL, protocol.CancelRequest("call-1", "front"),
                    ALICE).error_code == "forbidden"
    answer = _control(shell, protocol.Kind.CANCEL, protocol.CancelRequest("g", "alice"), ADMIN)
    assert answer.ok and answer.changed
    [r] = _replies(shell)[b"a1"]
    assert (r.request_id, r.status) == ("g", "cancelled")


@pytest.mark.parametrize("name", ["alice/sub", "alice/", "../alice", "a" * 65, " alice"])
def test_a_principal_field_that_names_no_principal_is_refused_not_read_as_part_of_an_id(shell, name):
    """`principal="alice/sub", request_id="x"` was the scoped id "alice/sub/x": alice's group "sub/x",
    reached through a field that names a principal -- and a typo (`--principal robot-a/`) answered
    `unknown` for a group in flight. A principal name holds no "/" (core/access.check_name)."""
    _submit(shell, b"a1", ALICE, "sub/x")
    for kind, msg in ((protocol.Kind.STATUS, protocol.StatusRequest("x", name)),
                      (protocol.Kind.CANCEL, protocol.CancelRequest("x", name))):
        for asker in (ALICE, ADMIN):
            reply = _control(shell, kind, msg, asker)
            assert (reply.ok, reply.error_code) == (False, "invalid_value"), (kind, asker.name)
            assert "principal" in reply.error
    assert _control(shell, protocol.Kind.STATUS, protocol.StatusRequest("sub/x", "alice"), ADMIN).state in (
        "queued", "admitted")


def test_without_keys_the_principal_field_is_not_read(shell):
    shell._authenticator = None
    _submit(shell, b"l1", ALICE, "g")  # keyless: every caller is one namespace
    assert set(shell.engine.groups) == {"g"}
    reply = _control(shell, protocol.Kind.STATUS, msgspec.structs.replace(protocol.StatusRequest("g"),
                                                                          principal="not/a-name"), ADMIN)
    assert reply.ok and reply.state in ("queued", "admitted")
