"""One group of 8 candidates at a time through a scheduler and a null worker (64x64, 4 steps), each
process stamping perf_counter() (CLOCK_MONOTONIC: one clock for every process on the host) at the points
trace.patch marks (README.md). Run from a checkout with trace.patch applied:

    CSTRACE=1 PYTHONPATH=THIS_DIR:. python THIS_DIR/round_trip.py [groups]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import zmq
from cstrace import t as stamp

from candidate_scheduler import protocol
from candidate_scheduler.bench.common import PROMPT
from candidate_scheduler.bench.settings import REDUCER
from candidate_scheduler.service.client import make_request, synthetic_image
from candidate_scheduler.service.launcher import Launcher, child_env

groups = int(sys.argv[1]) if len(sys.argv) > 1 else 400
env = child_env()
env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__)) + ":" + env.get("PYTHONPATH", "")
with Launcher(tempfile.mkdtemp(), env=env) as launcher:
    handle = launcher.scheduler()
    launcher.worker(handle, "null", 8)
    handle.wait_workers(1)
    image = synthetic_image(64, 64, seed=3)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(handle.request)
    lat, pings = [], []
    for i in range(groups):
        frames = protocol.encode(protocol.Kind.SUBMIT, make_request(image, PROMPT, request_id=f"r-{i}", count=8, seed=i,
                                                                    reducer=REDUCER, height=64, width=64, steps=4))
        t0 = time.perf_counter()
        stamp("C0")
        sock.send_multipart(frames)
        sock.poll(60_000)
        sock.recv_multipart()
        stamp("C9")
        lat.append(time.perf_counter() - t0)
    for i in range(200):
        t0 = time.perf_counter()
        sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(i)))
        sock.poll(6000)
        sock.recv_multipart()
        pings.append(time.perf_counter() - t0)
    sock.close(0)
print(f"round trip, median of groups 51-{groups}: {np.median(lat[50:]) * 1e3:.3f} ms; "
      f"PING round trip through the scheduler's loop: {np.median(pings) * 1e3:.3f} ms")
