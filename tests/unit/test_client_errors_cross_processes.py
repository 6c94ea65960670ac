"""The errors a client raises survive pickling, as they must to leave a worker process: a ServiceError
raised in a `concurrent.futures.ProcessPoolExecutor` worker (a robot fleet driven from a process pool) is
pickled there and unpickled by the parent. ServiceError's constructor takes the ErrorReply, while pickling
passes it the message string: unpickling raised AttributeError ('str' object has no attribute
'error_code'), and the pool, unable to read a result, broke and failed every pending call."""

from __future__ import annotations

import pickle

import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service.replies import (
    ClientClosed,
    ConnectionDropped,
    Forbidden,
    SchedulerUnavailable,
    ServiceError,
)


def test_a_service_error_keeps_its_type_message_and_reply_across_pickling():
    reply = protocol.ErrorReply("prompt is not a string", "bad_type", request_id="g7")
    back = pickle.loads(pickle.dumps(ServiceError(reply)))
    assert type(back) is ServiceError
    assert str(back) == "bad_type: prompt is not a string"
    assert (back.reply.error_code, back.reply.error, back.reply.request_id) == ("bad_type", "prompt is not a string", "g7")


@pytest.mark.parametrize("kind", [ClientClosed, ConnectionDropped, Forbidden, SchedulerUnavailable])
def test_the_other_client_errors_survive_pickling(kind):
    back = pickle.loads(pickle.dumps(kind("why")))
    assert type(back) is kind and str(back) == "why"


def test_a_protocol_error_keeps_its_kind_and_message_across_pickling():
    """What a client raises for a reply it cannot read: its constructor takes (kind, message)."""
    back = pickle.loads(pickle.dumps(protocol.ProtocolError("bad_msgpack", "not msgpack")))
    assert type(back) is protocol.ProtocolError and (back.kind, str(back)) == ("bad_msgpack", "not msgpack")
