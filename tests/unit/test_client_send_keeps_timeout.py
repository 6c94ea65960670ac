"""The blocking Client's send keeps to the timeout `submit` is given. With the scheduler away ZMQ queues
each SUBMIT, and once 1,000 are queued (a control loop that submits with a short timeout while the
scheduler is down gets there in minutes) a send waits for room: it waited its own 10 s whatever the
caller's timeout, so `submit(timeout_s=0.2)` blocked 10 s and raised SchedulerUnavailable. Now it raises
TimeoutError when its timeout runs out, as a wait does."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from candidate_scheduler.service import client as client_module
from candidate_scheduler.service.client import Client, SchedulerUnavailable, make_request

IMAGE = np.zeros((8, 8, 3), np.uint8)
QUEUED = 1000  # a DEALER's send queue (SNDHWM)


def _nobody() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def full_client(monkeypatch):
    monkeypatch.setattr(client_module, "SEND_TIMEOUT_MS", 3_000)  # the cap a send without a timeout keeps
    c = Client(_nobody(), liveness_s=None)
    for i in range(QUEUED):
        c.send(make_request(IMAGE, "pick", request_id=f"queued-{i}"))
    yield c
    c.close()


def test_a_submit_whose_send_waits_for_room_keeps_to_its_timeout(full_client):
    started = time.monotonic()
    with pytest.raises(TimeoutError):  # it was SchedulerUnavailable, after the send's own 3 s
        full_client.submit(IMAGE, "pick", request_id="late", timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    assert "late" not in full_client._sent_to  # not sent: nothing awaited


def test_a_send_without_a_timeout_still_gives_up_after_its_own(full_client):
    with pytest.raises(SchedulerUnavailable, match="could not send"):
        full_client.send(make_request(IMAGE, "pick", request_id="no-timeout"))
