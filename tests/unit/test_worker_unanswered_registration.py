"""A worker whose REGISTER goes unanswered says so in its log (worker/loop.py `_register`): a scheduler not
up yet and one that refuses the worker's CURVE keys both look like silence from the worker's side, and it
waited for either without a word -- an operator with a wrong key directory saw a worker that ran and a
scheduler that never heard of it."""

from __future__ import annotations

import logging
import threading
import time

import zmq

from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter


def test_a_register_nobody_answers_is_warned_about_and_the_worker_keeps_asking(caplog):
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # takes every REGISTER, answers none
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    worker = Worker(f"tcp://127.0.0.1:{port}", NullAdapter(4), worker_id="w", warmup_shapes=[],
                    register_timeout_s=0.02, unanswered_warn_s=0.1)
    thread = threading.Thread(target=worker.serve, daemon=True)
    caplog.set_level(logging.WARNING, logger="candidate_scheduler.worker")
    try:
        thread.start()
        deadline = time.monotonic() + 10
        registers = 0
        while time.monotonic() < deadline and not [r for r in caplog.records if "no answer" in r.getMessage()]:
            if silent.poll(50):
                silent.recv_multipart()
                registers += 1
        [warning] = [r for r in caplog.records if "no answer" in r.getMessage()][:1]
        assert f"tcp://127.0.0.1:{port}" in warning.getMessage() and "--curve-dir" in warning.getMessage()
        assert registers >= 2  # it kept asking
        assert not worker.registered.is_set()
    finally:
        worker.stop()
        thread.join(10)
        silent.close()
    assert not thread.is_alive()
