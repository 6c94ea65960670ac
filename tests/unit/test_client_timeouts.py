"""The blocking Client keeps to the timeout it is given: a first submit to a scheduler that does not
answer raises TimeoutError when `timeout_s` runs out, not after the client's first PING (`liveness_s`)."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service.client import Client, SchedulerUnavailable, make_request
from tests.unit.test_client_replies import Played, result

IMAGE = np.zeros((8, 8, 3), np.uint8)


def _nobody() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("with_control", [False, True])
def test_a_first_submit_keeps_to_its_timeout_when_nobody_answers(with_control):
    """submit(timeout_s=0.3) with liveness_s=2: it raised TimeoutError after 2 s, its first send having
    waited out a whole PING before the timeout was looked at."""
    with Client(_nobody(), _nobody() if with_control else None, liveness_s=2.0) as c:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            c.submit(IMAGE, "pick", timeout_s=0.3)
        assert time.monotonic() - started < 0.8
        assert c._incarnation is None  # the PING cut short says nothing of the scheduler: asked again next time
        assert c._sent_to == {} and c._pending == {}


@pytest.mark.parametrize("with_control", [False, True])
def test_a_first_submit_to_no_scheduler_is_unavailable_after_two_pings_not_three(with_control):
    """The first send's PING went unanswered, then the wait kept a whole silence of its own before a
    second PING: 3 x liveness_s (9 s at the default), against AsyncClient's 2 x."""
    with Client(_nobody(), _nobody() if with_control else None, liveness_s=0.5) as c:
        started = time.monotonic()
        with pytest.raises(SchedulerUnavailable):
            c.submit(IMAGE, "pick", timeout_s=30)
        assert time.monotonic() - started < 1.4  # 2 x 0.5 s, with room; 1.5 s before


def test_a_request_over_the_limit_fails_before_the_first_ping():
    """ValueError at once: it came after the client's first PING, `liveness_s` with nobody answering."""
    huge = make_request(np.zeros((1, 1, 3), np.uint8), "pick")
    huge = protocol.SubmitRequest(**{**{f: getattr(huge, f) for f in huge.__struct_fields__},
                                     "prompt": "x" * (protocol.MAX_MESSAGE_BYTES + 1)})
    with Client(_nobody(), liveness_s=2.0) as c:
        started = time.monotonic()
        with pytest.raises(ValueError, match="over the scheduler's limit"):
            c.send(huge)
        assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("liveness_s", [None, 0.5])
def test_a_wait_of_no_time_takes_a_reply_that_has_come(liveness_s):
    """wait(rid, 0) once the reply is in: the result. It raised TimeoutError without looking at the socket."""
    played = Played(lambda msg, state: [(protocol.Kind.RESULT, result(msg.request_id))])
    try:
        with Client(played.endpoint, liveness_s=liveness_s) as c:
            c.send(make_request(IMAGE, "pick", request_id="g"))
            assert c.ping(2)  # answered after the group's reply: that reply is in (kept, or in the socket)
            c.send(make_request(IMAGE, "pick", request_id="h"))
            time.sleep(0.3)
            assert c.wait("g", 0).ok and c.wait("h", 0).ok
            with pytest.raises(TimeoutError):
                c.wait("never-sent", 0)
    finally:
        played.close()
