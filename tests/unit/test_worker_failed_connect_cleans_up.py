"""A worker whose connect fails (worker/loop.py `serve`, worker/link.py `connect`) raises and leaves
nothing behind: `serve` used to start its compute thread (and the conditioning thread under it) before
connecting, and a connect that raised (a key directory without the keys, an endpoint ZMQ refuses) left
both running, blocked on an inbox nobody feeds, with their sockets and the ZMQ context open -- in a library
caller's process for good. Terminating the context then hung as well: `connect` left the socket it made
open, held by the raised error's traceback."""

from __future__ import annotations

import threading

import pytest
import zmq

from candidate_scheduler.service.keys import KeyDirError
from candidate_scheduler.worker.loop import Worker
from candidate_scheduler.worker.null_adapter import NullAdapter


def _serve_in_thread(worker: Worker) -> BaseException | None:
    """Run `serve`; what it raised (None: it returned). A serve that hangs fails the test, not the run."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.serve()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "serve neither returned nor raised"
    return raised[0] if raised else None


def _worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name in ("compute", "conditioning") and t.is_alive()}


@pytest.mark.parametrize("case", ["key_dir_without_keys", "endpoint_zmq_refuses"])
def test_a_failed_connect_raises_and_leaves_no_thread_nor_context(case, tmp_path):
    if case == "key_dir_without_keys":
        worker = Worker("tcp://127.0.0.1:1", NullAdapter(4), worker_id="w", warmup_shapes=[], curve_dir=str(tmp_path))
    else:
        worker = Worker("tcp://127.0.0.1", NullAdapter(4), worker_id="w", warmup_shapes=[])  # no port
    before = _worker_threads()  # another test's, if any
    raised = _serve_in_thread(worker)
    assert isinstance(raised, (KeyDirError, zmq.ZMQError)), raised
    for thread in _worker_threads() - before:
        thread.join(5)  # they end at once; the join only spares a slow machine a false failure
    assert not _worker_threads() - before
    assert worker.ctx.closed

