"""An assignment message stays under the worker socket's limit: slices with large observations that
would weigh more than MAX_ASSIGNMENT_BYTES together go to the worker as consecutive assignments. Before,
three legal 21 MB observations co-batched into one 63 MB BATCH; over 64 MiB the worker's ZMQ connection
closes and does not come back, and those groups were never answered."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler import convert, protocol
from candidate_scheduler.core import schedule
from tests.unit.test_engine import Harness, expected

BIG = np.full((2000, 3500, 3), 7, dtype=np.uint8)  # 21 MB: three are over the 48 MiB budget


def test_the_budget_fits_any_slice_alone_and_any_assignment_under_the_message_limit():
    assert protocol.MAX_OBSERVATION_BYTES < schedule.MAX_ASSIGNMENT_BYTES < protocol.MAX_MESSAGE_BYTES - 8 * 2**20


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_heavy_slices_go_as_consecutive_assignments_each_under_the_limit(batching):
    h = Harness(batching=batching)
    for i in range(3):
        h.submit(f"big{i}", count=1, seed=10 + i, images=BIG)
    h.submit("small", count=1, seed=20)  # light: rides along with what it fits
    h.register("w1", capacity=8)
    sent = list(h.work)
    assert len(sent) >= 2, "all in one message"
    for send in sent:
        _kind, msg = convert.work_to_wire(send)
        frames = protocol.encode(protocol.Kind.BATCH, msg)
        assert sum(len(f) for f in frames) < protocol.MAX_MESSAGE_BYTES
        assert sum(sw.group.request.images.nbytes for sw in send.slices) <= schedule.MAX_ASSIGNMENT_BYTES
    assert sorted(sw.dispatch.request_id for send in sent for sw in send.slices) == ["big0", "big1", "big2", "small"]
    h.run_all()
    for i in range(3):
        r = h.reply(f"big{i}")
        assert r.status == "done" and np.array_equal(r.candidates[0], expected(10 + i)[0])
    assert h.reply("small").status == "done"
