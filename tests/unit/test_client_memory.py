"""What a blocking Client keeps per group it sent: bounded, even when its groups are never waited for."""

from __future__ import annotations

import numpy as np

from candidate_scheduler.service import client as client_module
from candidate_scheduler.service.client import Client, make_request

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
