"""A worker's id is named in every heartbeat, result and STATS reply: one of megabytes (or none, or with
control characters) is refused at registration, and by `worker --worker-id` before it starts."""

from __future__ import annotations

import pytest

from candidate_scheduler import cli
from candidate_scheduler.core.messages import Registration, StopWorker
from tests.unit.test_engine import Harness, capability


@pytest.mark.parametrize("wid", ["", "w" * 513, "w1\n", "a\x00b"])
def test_a_worker_id_no_reply_should_carry_is_refused_at_registration(wid):
    h = Harness()
    out = h.engine.register(b"peer", Registration(wid, capability(), 8), h.now)
    assert [type(m) for m in out] == [StopWorker] and "worker id" in out[0].reason
    assert not h.engine.workers


def test_a_device_name_of_megabytes_is_refused_and_a_long_host_id_is_not():
    h = Harness()
    out = h.engine.register(b"peer", Registration("w1", capability(), 8, device="x" * 1_000_000), h.now)
    assert [type(m) for m in out] == [StopWorker] and not h.engine.workers
    ok = "a" * 253 + "-123456-abcdef"  # the longest host name, then pid and random part: a default id
    h.engine.register(b"peer2", Registration(ok, capability(), 8), h.now)
    assert ok in h.engine.workers


def test_worker_id_flag_refuses_what_registration_would(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["worker", "--worker-id", "w" * 600])
    assert exc.value.code == 2 and "worker id" in capsys.readouterr().err
