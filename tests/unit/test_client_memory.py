"""What a blocking Client keeps per group it sent: bounded, even when its groups are never waited for."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service import client as client_module
from candidate_scheduler.service.client import Client, SchedulerUnavailable, make_request

IMAGE = np.zeros((8, 8, 3), np.uint8)


def test_the_incarnations_of_groups_never_waited_for_are_bounded(monkeypatch):
    monkeypatch.setattr(client_module, "_SENT_TO_KEPT", 3)
    # nobody listens there: ZMQ queues the sends (no liveness PING, so no scheduler is needed)
    c = Client("tcp://127.0.0.1:9", liveness_s=None)
    try:
        ids = [c.send(make_request(IMAGE, "pick", request_id=f"g{i}")) for i in range(5)]
        assert list(c._sent_to) == ids[2:]  # the oldest forgotten first
    finally:
        c.close()


def test_a_reply_that_comes_after_its_wait_said_unavailable_counts_against_the_late_budget():
    """A raw send and wait that raised SchedulerUnavailable (a scheduler stopped a while, then back): its
    reply came later and was kept outside the late replies' byte budget, held until the client closed."""
    from tests.unit.test_client_replies import Played, result

    late = {"g"}

    def answer(msg, state):
        if msg.request_id == "g":
            return []  # withheld: the scheduler goes quiet
        return [(protocol.Kind.RESULT, result(rid)) for rid in (*late, msg.request_id)]

    played = Played(answer)
    try:
        with Client(played.endpoint, liveness_s=0.3) as c:
            c.send(make_request(IMAGE, "pick", request_id="g"))
            played.state["mute"] = True
            with pytest.raises(SchedulerUnavailable):
                c.wait("g", timeout_s=10)
            played.state["mute"] = False
            assert c.submit(IMAGE, "pick", request_id="h", timeout_s=10).ok  # "g"'s reply comes with it
            assert "g" in c._late and c._late_bytes > 0  # kept, and counted
            assert c.wait("g", timeout_s=1).ok and c._late_bytes == 0  # still there for a wait that asks
    finally:
        played.close()
