"""A blocking Client with a control endpoint (its liveness PINGs go there) never takes a stopping run's
second answer as the answer to the group's resend, against a scheduler the test plays
(tests/unit/test_client_replies.py's `Played`, on both sockets)."""

from __future__ import annotations

import time

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.service.client import Client
from tests.unit.test_client_replies import Played, result

IMAGE = np.zeros((8, 8, 3), np.uint8)


def test_a_second_answer_from_a_stopping_run_is_not_taken_as_the_next_runs_with_a_control_endpoint():
    """Run A, paused past the liveness verdict, gets the group and its resend, then stops and answers both
    `shutting_down`; the next run, B, comes up. The client takes the first answer, waits for B on the control
    socket and sends again: the answer is B's `done`. A's second `shutting_down`, still unread on the request
    socket (the PINGs went to the control one), was taken as B's, and the client waited for a run after B
    until its timeout."""

    def answer(msg, state):
        n = len(state["submits"])
        if n == 1:
            state["mute"] = True  # paused: PINGs go unanswered, the client gives up on it
            time.sleep(0.6)
            state["mute"] = False
            return []
        if n == 2:  # the resend reached the same run, which now stops: both SUBMITs answered
            state["incarnation"] = "B"  # and the next run is up on the same address
            return [(protocol.Kind.RESULT, result(msg.request_id, "failed", "shutting_down"))] * 2
        return [(protocol.Kind.RESULT, result(msg.request_id))]

    played = Played(answer)
    try:
        with Client(played.endpoint, played.endpoint, liveness_s=0.2) as c:
            r = c.submit(IMAGE, "pick", request_id="g", resubmit=True, timeout_s=5)
            assert (r.status, r.resent) == ("done", ["unavailable", "shutting_down"]), played.state["submits"]
            assert c.ping(1) and c._pending == {} and c._sent_to == {}
    finally:
        played.close()
