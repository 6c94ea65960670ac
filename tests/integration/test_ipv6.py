"""`serve --host ::1`: the scheduler, a worker and a client over IPv6 loopback. It was refused as public
(`tcp://::1:PORT` is no endpoint ZMQ reads, so it was not seen as loopback), and a ZMQ socket binds or
dials an IPv6 address only when asked (`endpoints.ipv6_for`)."""

from __future__ import annotations

from candidate_scheduler.service.client import make_request, synthetic_image


def test_a_scheduler_on_ipv6_loopback_serves_a_worker_and_a_client_without_keys(services):
    sched = services.scheduler("--host", "::1")
    assert sched.request.startswith("tcp://[::1]:") and sched.worker.startswith("tcp://[::1]:")
    services.worker(sched, "null", 8, 0.0)
    sched.wait_workers(1, timeout_s=60)
    with sched.client() as c:
        r = c.wait(c.send(make_request(synthetic_image(64, 64, seed=1), "pick", count=4, seed=3)), timeout_s=60)
    assert r.status == "done" and r.action is not None
