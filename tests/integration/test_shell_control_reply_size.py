"""A control reply over the message limit, on a scheduler run in this process: workers that registered
with ids of tens of MB made STATS (which names every worker) larger than MAX_MESSAGE_BYTES. The
client's socket drops such a message together with its connection, so the operator's STATS -- and
whatever else it had in flight on that connection -- went unanswered. Now a reply that would not fit
is answered with a typed refusal (`reply_too_large`), counted, and the scheduler keeps serving.

Registration now refuses an id over 512 characters (core/worker_link.check_worker_id), so a STATS that
large takes a fleet of ~100,000 workers: the test lowers the limit the shell checks replies against
instead, and registers a few dozen workers with ids of the longest kind."""

from __future__ import annotations

import threading

import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.server import Scheduler, SchedulerConfig
from candidate_scheduler.worker.null_adapter import NullAdapter
from tests.reliability.helpers import RawPeer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def scheduler():
    sched = Scheduler(SchedulerConfig(request_endpoint="tcp://127.0.0.1:0", control_endpoint="tcp://127.0.0.1:0",
                                      worker_endpoint="tcp://127.0.0.1:0", metrics_port=None))
    bound = sched.bind()
    thread = threading.Thread(target=sched.serve, daemon=True)
    thread.start()
    try:
        yield sched, bound
    finally:
        sched.stop_now.set()
        thread.join(10)


def _control(endpoint: str, kind: protocol.Kind, payload) -> protocol.ControlReply | None:
    with RawPeer(endpoint) as peer:
        peer.send(protocol.encode(kind, payload))
        frames = peer.recv(15)
    if frames is None:
        return None
    return protocol.decode_frames(frames, {protocol.Kind.CONTROL_REPLY})[1]


def test_a_control_reply_over_the_message_limit_is_a_typed_refusal(scheduler, monkeypatch):
    sched, bound = scheduler
    monkeypatch.setattr(protocol, "MAX_MESSAGE_BYTES", 16 * 1024)  # read by the shell at each reply
    ctx = zmq.Context.instance()
    workers = []
    try:
        for i in range(40):  # each REGISTER fits the limit; STATS, naming them all, does not
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(bound["worker"])
            worker_id = f"w{i:02d}-" + "x" * 508
            sock.send_multipart(protocol.encode(protocol.Kind.REGISTER, protocol.RegisterMsg(
                worker_id, NullAdapter(8).capability_dict(), 8)))
            assert sock.poll(15_000), "no REGISTERED"
            kind = protocol.parse_header(sock.recv_multipart()[0], {protocol.Kind.REGISTERED, protocol.Kind.WORKER_STOP})
            assert kind is protocol.Kind.REGISTERED
            workers.append(sock)
        stats = _control(bound["control"], protocol.Kind.STATS, protocol.Empty())
        assert stats is not None, "STATS went unanswered: the reply was over the client's message limit"
        assert not stats.ok and stats.error_code == "reply_too_large", stats
        assert sched.engine.counters["handler_errors"] == 0
    finally:
        for sock in workers:
            sock.close(0)
    drain = _control(bound["control"], protocol.Kind.DRAIN, protocol.Empty())  # still serving
    assert drain is not None and drain.ok
