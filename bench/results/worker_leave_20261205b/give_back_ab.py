"""One worker holds a long group (60 steps of 50 ms = 3 s) and the next one, sent ahead (--prefetch-lead inf);
a second worker joins; the first gets SIGTERM. Prints how long after the signal the next group is answered."""
import json, os, signal, sys, tempfile, time
import numpy as np
from candidate_scheduler.service.launcher import Launcher
from candidate_scheduler.service.client import make_request, synthetic_image
IMAGE = synthetic_image(64, 64, seed=5)
with Launcher(tempfile.mkdtemp()) as L:
    s = L.scheduler("--prefetch-lead", "inf")
    leaver = L.worker(s, "null", 4, step_delay=0.05)
    s.wait_workers(1)
    with s.client() as c:
        long = c.send(make_request(IMAGE, "pick", count=4, seed=1, steps=60))
        nxt = c.send(make_request(IMAGE, "pick", count=4, seed=2, steps=4))
        t = time.monotonic()
        while not (c.status(long).state == "running" and c.status(nxt).state == "running"):
            time.sleep(0.02)
            assert time.monotonic() - t < 10
        L.worker(s, "null", 4, step_delay=0.05)
        s.wait_workers(2)
        signalled = time.monotonic()
        os.kill(leaver.pid, signal.SIGTERM)
        r = c.wait(nxt, timeout_s=30)
        next_s = time.monotonic() - signalled
        rl = c.wait(long, timeout_s=30)
        long_s = time.monotonic() - signalled
        print(json.dumps({"next_after_signal_s": round(next_s, 3), "long_after_signal_s": round(long_s, 3),
                          "statuses": [r.status, rl.status], "next_retries": r.metrics["retries"]}))
