"""A CURVE socket of the scheduler admits no key its ZAP handler has not approved, even when no handler
answers: libzmq's default then lets any key in (ZAP_ENFORCE_DOMAIN off). The handler thread is stopped
here to stand for one gone or not yet started."""

from __future__ import annotations

import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service import keys
from candidate_scheduler.service.server import Scheduler, SchedulerConfig


def test_with_no_zap_handler_answering_a_stranger_key_gets_nothing_through(tmp_path):
    keys.init_dir(tmp_path)
    sched = Scheduler(SchedulerConfig(request_endpoint="tcp://127.0.0.1:0", control_endpoint="tcp://127.0.0.1:0",
                                      worker_endpoint="tcp://127.0.0.1:0", metrics_port=None,
                                      curve_dir=str(tmp_path)))
    bound = sched.bind()
    sched._authenticator.stop()
    ctx = zmq.Context()
    stranger = ctx.socket(zmq.DEALER)
    try:
        server_public, _ = zmq.auth.load_certificate(str(tmp_path / "server.key"))
        keys.ClientKeys.ephemeral(server_public).apply(stranger)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.connect(bound["worker"])
        stranger.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(1)))
        assert not sched.worker_sock.poll(1000), "a key nobody approved reached the worker link"
    finally:
        stranger.close(0)
        ctx.term()
        sched.close()
