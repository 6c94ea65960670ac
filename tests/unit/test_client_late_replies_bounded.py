"""A blocking Client keeps the reply that comes after its wait gave up (TimeoutError), for a wait that may
come again (`wait(rid, 0)` looks again). Those were bounded by count only (100,000 groups sent): a robot
loop that sends an observation, waits 100 ms and moves on kept every late reply, candidates' arrays and
all (up to 64 MiB each), as long as the client lived. They are bounded by bytes too now: past the budget
the oldest go, and a wait for one of those says so at once."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.service import client as client_module
from candidate_scheduler.service.client import Client, make_request
from tests.unit.test_client_replies import Played

IMAGE = np.zeros((8, 8, 3), np.uint8)
CANDIDATES = np.zeros((16, 50, 8), np.float32)  # 25.6 KB a reply


def _answer_the_one_before(msg, state):
    """Each SUBMIT is answered when the next one comes: every wait gives up before its reply comes."""
    before, state["last"] = state.get("last"), msg.request_id
    if before is None:
        return []
    reply = protocol.GroupResult(before, "done", candidates=protocol.array_to_wire(CANDIDATES))
    return [(protocol.Kind.RESULT, reply)]


def test_late_replies_are_kept_within_a_byte_budget_the_oldest_dropped_first(monkeypatch):
    monkeypatch.setattr(client_module, "_LATE_KEPT_BYTES", 2 * CANDIDATES.nbytes + 4096,
                        raising=False)  # two replies' worth (raising: the bound is new)
    played = Played(_answer_the_one_before)
    try:
        with Client(played.endpoint, liveness_s=None) as c:
            for i in range(6):
                with pytest.raises(TimeoutError):
                    c.wait(c.send(make_request(IMAGE, "pick", request_id=f"g{i}")), timeout_s=0.01)
            assert c.ping(5)  # its PONG comes after the replies to g0..g4: every one has been read by then
            assert sorted(c._pending) == ["g3", "g4"]  # the newest two (all five were kept)
            with pytest.raises(TimeoutError, match="dropped"):  # at once, not after its 30 s
                c.wait("g1", timeout_s=30)
            r = c.wait("g4", timeout_s=0)
            assert r.status == "done" and r.candidates.shape == CANDIDATES.shape
            assert c.wait("g3", timeout_s=0).status == "done"
            assert (c._pending, c._late, c._late_bytes) == ({}, {}, 0)
    finally:
        played.close()
