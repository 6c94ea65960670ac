"""How a worker encodes an assignment's answer (worker/loop.py, `Worker._answer`): an output that
cannot travel fails only its own group, and an answer never goes out over the message limit (the
scheduler's socket drops such a message with the connection, and then retries the whole assignment,
which comes back just as large)."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.core.work import GroupOutput
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter


class Pipe:
    """The compute thread's end of the inproc pipe: keeps what is sent."""

    def __init__(self):
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames) -> None:
        self.sent.append(list(frames))


@pytest.fixture
def answer():
    worker = Worker("tcp://127.0.0.1:1", NullAdapter(4), worker_id="w", warmup_shapes=[])
    pipe = Pipe()

    def send(outputs: list[GroupOutput], report=dict) -> tuple[int, protocol.BatchResultMsg]:
        worker._answer(pipe, 7, outputs, report)
        _tag, *frames = pipe.sent.pop()
        return len(frames[1]), protocol.decode_frames(frames, protocol.WORKER_KINDS)[1]

    yield send
    worker.ctx.term()


def ok(request_id: str, rows: int = 1, width: int = 7) -> GroupOutput:
    return GroupOutput(request_id, "ok", list(range(rows)), np.ones((rows, 1, 4, width), np.float32))


def test_an_output_that_cannot_be_encoded_fails_its_own_group_only(answer):
    bad = GroupOutput("bad", "ok", [0], np.ones((1, 1, 4, 7), np.float32),
                      rollout={"latents": np.ones((2, 2), np.complex64)})  # no such dtype on the wire
    _size, msg = answer([ok("a"), bad, ok("b")])
    assert [(o.request_id, o.status, o.error_code) for o in msg.outputs] == [
        ("a", "ok", None), ("bad", "error", "model_error"), ("b", "ok", None)]
    assert "complex64" in msg.outputs[1].error


def test_a_report_that_cannot_be_encoded_costs_the_report_not_the_outputs(answer):
    _size, msg = answer([ok("a")], report=lambda: {"wall_s": object()})
    assert [(o.request_id, o.status) for o in msg.outputs] == [("a", "ok")]


def test_an_answer_over_the_message_limit_fails_the_output_too_large_alone_and_keeps_the_rest(answer):
    width = protocol.MAX_MESSAGE_BYTES // (4 * 4) + 1  # one candidate's actions alone are over the limit
    size, msg = answer([ok("small"), ok("huge", 1, width), ok("small2")])
    assert size <= protocol.MAX_MESSAGE_BYTES
    assert [(o.request_id, o.status, o.error_code) for o in msg.outputs] == [
        ("small", "ok", None), ("huge", "error", "result_too_large"), ("small2", "ok", None)]


def test_outputs_that_fit_alone_but_not_together_are_retried_not_failed(answer):
    width = protocol.MAX_MESSAGE_BYTES // (4 * 4 * 2) + 1024  # each a little over half the limit
    size, msg = answer([ok("a", 1, width), ok("b", 1, width)])
    assert size <= protocol.MAX_MESSAGE_BYTES
    # one goes through; the other is the worker's fault (a retry from its snapshots runs it alone)
    assert sorted((o.status, o.error_code) for o in msg.outputs) == [("error", "worker_error"), ("ok", None)]
