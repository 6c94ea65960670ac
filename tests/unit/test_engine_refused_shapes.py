"""One candidate of a forward shape too many for a worker (core/fleet_rows.py, core/worker_link.py): when a
slice of one row running alone runs a worker out of memory, that worker is sent no more of that shape and
keeps its capacity for the others; the slice runs on another worker, and a group fails only when no live
worker takes its shape -- then later groups of the shape are refused at admission, not queued for good."""

from __future__ import annotations

import pytest

from candidate_scheduler.core.messages import Registration
from candidate_scheduler.core.work import SamplingSpec
from tests.unit.test_engine import Harness, capability, submission

BIG = {"height": 128, "width": 128}  # another forward shape than the default's


def _oom(h: Harness, send) -> None:
    h.answer(send, status="error", error_code="out_of_memory", report={"oom_rows": 1, "oom_step": 3})


def _worker_of(send) -> str:
    return send.identity.decode()


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_a_one_row_out_of_memory_moves_the_shape_to_another_worker_and_keeps_the_capacity(batching):
    h = Harness(batching=batching)
    h.register("w1", capacity=8)
    h.register("w2", capacity=8)
    h.take(h.engine.submit(("client", "big"), submission("big", count=1, sampling=BIG), h.now))
    [first] = h.work
    oomed = _worker_of(first)
    _oom(h, first)
    other = [s for s in h.work[1:] if any(sl.dispatch.request_id == "big" for sl in s.slices)]
    assert [_worker_of(s) for s in other] == [{"w1": "w2", "w2": "w1"}[oomed]]
    h.run_all()
    assert h.reply("big").status == "done"
    w = h.engine.workers[oomed]
    label = SamplingSpec(steps=4, **BIG).forward_label()
    assert w.capacity == 8 and h.engine.stats()["workers"][oomed]["refuses"] == [label]
    # the default shape still goes there, at its full capacity
    sent_before = len(h.work)
    for i in range(16):
        h.take(h.engine.submit(("client", f"s{i}"), submission(f"s{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    rows_there = sum(len(sl.dispatch.candidate_ids) for s in h.work[sent_before:] if _worker_of(s) == oomed
                     for sl in s.slices)
    assert rows_there == 8
    h.run_all()
    assert all(h.reply(f"s{i}").status == "done" for i in range(16))


def test_when_no_live_worker_takes_the_shape_its_groups_fail_and_new_ones_are_refused():
    h = Harness()
    h.register("w1", capacity=8)
    h.register("w2", capacity=8)
    h.take(h.engine.submit(("client", "a"), submission("a", count=1, sampling=BIG), h.now))
    _oom(h, h.work[0])
    _oom(h, h.work[1])  # the other worker too
    r = h.reply("a")
    assert (r.status, r.error_code) == ("failed", "out_of_memory") and "any live worker" in r.error
    h.take(h.engine.submit(("client", "b"), submission("b", count=2, sampling=BIG), h.now))
    r = h.reply("b")
    assert (r.status, r.error_code) == ("rejected", "does_not_fit") and "out of memory" in r.error
    h.take(h.engine.submit(("client", "c"), submission("c", count=2), h.now))  # other shapes still run
    h.run_all()
    assert h.reply("c").status == "done"


def test_groups_queued_for_a_shape_the_last_taker_refuses_fail_rather_than_wait():
    h = Harness()
    h.register("w1", capacity=1)
    h.take(h.engine.submit(("client", "a"), submission("a", count=1, sampling=BIG), h.now))
    h.take(h.engine.submit(("client", "q"), submission("q", count=1, seed=2, sampling=BIG), h.now))
    assert len(h.work) == 1  # q waits behind a on the one-row worker
    _oom(h, h.work[0])
    assert h.reply("a").error_code == "out_of_memory"
    assert (h.reply("q").status, h.reply("q").error_code) == ("failed", "out_of_memory")


def test_a_worker_registering_again_is_sent_the_shape_again():
    h = Harness()
    h.register("w1", capacity=8)
    h.take(h.engine.submit(("client", "a"), submission("a", count=1, sampling=BIG), h.now))
    _oom(h, h.work[0])
    assert h.reply("a").error_code == "out_of_memory"
    h.take(h.engine.register(b"w1", Registration("w1", capability(8), 8, pid=2), h.now))  # restarted
    h.take(h.engine.submit(("client", "b"), submission("b", count=1, sampling=BIG), h.now))
    h.run_all()
    assert h.reply("b").status == "done"
