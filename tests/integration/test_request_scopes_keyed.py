"""Over real CURVE sockets, each principal's request ids are its own (core/request_scope.py): two robots
using the same id at once both run and are each answered under the id they sent; a robot reusing
another's ended id leaves the owner's kept reply alone; the CLI's admin reaches a robot's group with
`--principal`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from candidate_scheduler.bench.scrape import scrape
from candidate_scheduler.service.client import Client, make_request, synthetic_image
from candidate_scheduler.service.keys import ClientKeys, add_key, init_dir
from tests.conftest import ENV, ROOT, wait_for

IMAGE = synthetic_image()
ANSWERED = 'candidate_scheduler_resubmissions_total{outcome="answered"}'


@pytest.fixture
def keys(tmp_path) -> Path:
    d = tmp_path / "keys"
    init_dir(d)
    add_key(d, "robot-a", "client", "robots")
    add_key(d, "robot-b", "client", "robots")
    return d


def test_two_robots_share_an_id_and_neither_touches_the_others_group(services, keys):
    sched = services.scheduler("--curve-dir", str(keys), metrics=True)
    services.worker(sched, "null", 8, 0.02, "--curve-dir", str(keys))
    sched.wait_workers(1)
    with Client(sched.request, sched.control, keys=ClientKeys.load(keys, "robot-a"), timeout_s=30) as a, \
            Client(sched.request, sched.control, keys=ClientKeys.load(keys, "robot-b"), timeout_s=30) as b:
        mine = make_request(IMAGE, "pick", count=2, seed=11, steps=20, request_id="episode-3")
        a.send(mine)
        b.send(make_request(IMAGE, "pick", count=2, seed=22, steps=20, request_id="episode-3"))
        ra, rb = a.wait("episode-3"), b.wait("episode-3")
        assert (ra.status, ra.request_id, ra.candidate_seeds[0]) == ("done", "episode-3", 11)
        assert (rb.status, rb.request_id, rb.candidate_seeds[0]) == ("done", "episode-3", 22)

        # a's group ends first; b then uses the same id for its own: run for b, and a's kept reply stays a's
        mine = make_request(IMAGE, "pick", count=2, seed=44, steps=20, request_id="episode-4")
        first_a = a.wait(a.send(mine))
        later_b = b.submit(IMAGE, "pick", count=2, seed=55, steps=20, request_id="episode-4")
        assert first_a.status == later_b.status == "done" and later_b.candidate_seeds[0] == 55
        before = scrape(sched.metrics).get(ANSWERED, 0.0)
        again_a = a.wait(a.send(mine))  # a's resubmission: answered from a's kept reply, not run again
        assert again_a.status == "done" and again_a.candidate_seeds == first_a.candidate_seeds
        assert np.array_equal(again_a.action, first_a.action)
        assert scrape(sched.metrics).get(ANSWERED, 0.0) == before + 1

        # a long group of a's, reached by the CLI's admin only when it names a's namespace
        a.send(make_request(IMAGE, "pick", count=1, steps=500, request_id="long"))
        wait_for(lambda: a.status("long").state in ("admitted", "running"), 10, "a's long group in flight")
        assert b.status("long").state == "unknown" and not b.cancel("long").changed  # b's own "long": nobody's

        def cli(*args: str) -> dict:
            out = subprocess.run([sys.executable, "-m", "candidate_scheduler.cli", *args, "--host", "127.0.0.1",
                                  "--control-port", sched.control.rsplit(":", 1)[1], "--curve-dir", str(keys)],
                                 capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
            return json.loads(out.stdout.strip().splitlines()[-1])

        assert cli("status", "long")["state"] == "unknown"  # the admin's own namespace
        assert cli("cancel", "long", "--principal", "robot-a")["changed"] is True
        assert a.wait("long").status == "cancelled"
