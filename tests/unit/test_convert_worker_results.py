"""A worker's BATCH_RESULT that decodes but carries arrays the reply cannot serve: float64 actions beyond
float32's range (the served action is float32: they became inf, answered `done`), and rollout step
indices that are not step indices (a NaN became the scheduler's own internal_error, a float index past
2**64 a reply that could not be encoded, a negative one was served). Each is the worker's fault: the slice is retried, as for any
malformed result, and the group is answered once, from the retry.

Driven through the wire (protocol.encode / decode, convert.worker_result_from_wire) into the engine, in
process: no sockets."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import Registration, Reply, SendWork
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.spec import ModelCapability
from candidate_scheduler.core.work import ROLLOUT_FIELDS, GroupOutput

IMAGE = np.full((16, 16, 3), 7, dtype=np.uint8)
H, D, STEPS = 16, 7, 4


class Fleet:
    """An engine with one worker; every reply and assignment it sent."""

    def __init__(self):
        self.engine = Engine(EngineConfig(prefetch=0))
        self.now = 100.0
        self.replies: dict[str, list] = {}
        self.work: list[SendWork] = []
        cap = ModelCapability("fake", reducers=("mean",), max_candidates_per_batch=8).to_dict()
        self._take(self.engine.register(b"w1", Registration("w1", cap, 8), self.now))

    def _take(self, out: list) -> None:
        for m in out:
            if isinstance(m, Reply):
                self.replies.setdefault(m.result.request_id, []).append(m.result)
            elif isinstance(m, SendWork):
                self.work.append(m)

    def submit(self, rid: str, count: int = 2, rollout: bool = False) -> SendWork:
        sub = Submission(rid, IMAGE, "pick", {"count": count, "reducer": "none" if rollout else "mean"}, 1,
                         {"steps": STEPS, "rollout": rollout})
        self._take(self.engine.submit(("client", rid), sub, self.now))
        return self.work[-1]

    def answer(self, send: SendWork, actions_dtype=np.float32, value: float = 0.5, step_indices=None,
               rollout_len: int = STEPS) -> None:
        """Answer `send` through the wire, as a worker would."""
        outputs = []
        for sw in send.slices:
            d = sw.dispatch
            n = len(d.candidate_ids)
            actions = np.full((n, 1, H, D), value, actions_dtype)
            out = GroupOutput(d.request_id, "ok", list(d.candidate_ids))
            if sw.group.sampling.rollout:
                out.rollout = {name: np.zeros((n, 1, rollout_len), np.float32) for name in ROLLOUT_FIELDS}
                out.rollout_meta = {"sigmas": np.zeros(STEPS + 1, np.float32), "timesteps": np.zeros(STEPS, np.float32),
                                    "step_indices": np.arange(STEPS) if step_indices is None else step_indices}
            # the actions as sent, in their own dtype (output_to_wire would cast them to float32 first)
            msg = convert.output_to_wire(out)
            outputs.append(msgspec.structs.replace(msg, actions=protocol.array_to_wire(actions)))
        frames = protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg("w1", send.batch_id, outputs))
        msg = protocol.decode(protocol.Kind.BATCH_RESULT, frames[1])
        self._take(self.engine.worker_result(b"w1", convert.worker_result_from_wire(msg), self.now))


def _retried_then_done(fleet: Fleet, rid: str, first: SendWork, **good) -> None:
    assert rid not in fleet.replies, fleet.replies.get(rid)  # nothing served from the bad answer
    retry = fleet.work[-1]
    assert retry is not first and retry.batch_id in fleet.engine.assignments
    fleet.answer(retry, **good)
    [reply] = fleet.replies[rid]
    assert reply.status == "done", (reply.status, reply.error_code, reply.error)
    for arr in (reply.action, reply.candidates):
        assert arr is None or np.isfinite(np.asarray(arr, np.float32)).all()
    assert fleet.engine.counters["internal_errors"] == 0


def test_float64_actions_beyond_float32_are_retried_not_served_as_inf():
    fleet = Fleet()
    first = fleet.submit("big")
    fleet.answer(first, actions_dtype=np.float64, value=1e300)  # finite, but inf as the float32 it is served as
    _retried_then_done(fleet, "big", first)


@pytest.mark.parametrize("step_indices", [
    np.array([np.nan, 1.0, 2.0, 3.0]),  # int(nan) raised while the reply was built: internal_error
    np.array([0.0, 1.0, 2.0, 3.0]),  # integral floats still are not indices
    np.array([-1, 0, 1, 2], np.int64),  # served as is
    np.array([0, 1, 2, 2**40], np.int64),  # served, though no step count comes near it
    np.arange(STEPS).reshape(2, 2),
], ids=["nan", "float", "negative", "huge", "2d"])
def test_rollout_step_indices_that_are_not_step_indices_are_retried(step_indices):
    fleet = Fleet()
    first = fleet.submit("roll", rollout=True)
    fleet.answer(first, step_indices=step_indices)
    _retried_then_done(fleet, "roll", first)
    [reply] = fleet.replies["roll"]
    assert list(reply.rollout["step_indices"]) == list(range(STEPS))


def test_valid_float32_results_still_fold():
    fleet = Fleet()
    send = fleet.submit("fine")
    fleet.answer(send)
    [reply] = fleet.replies["fine"]
    assert reply.status == "done" and np.allclose(reply.action, 0.5)


def test_a_worker_sends_float_rollout_arrays_as_float32_so_the_scheduler_serves_them():
    """The scheduler serves float32 only: an adapter's float64 rollout goes as float32, as its actions do."""
    import numpy as np

    from candidate_scheduler import convert
    from candidate_scheduler.core.work import GroupOutput

    out = GroupOutput("g", "ok", candidate_ids=[0], actions=np.zeros((1, 1, 4, 7), np.float64),
                      rollout={"log_probs": np.zeros((1, 2), np.float64)},
                      rollout_meta={"sigmas": np.ones(3, np.float64), "step_indices": np.arange(2)})
    msg = convert.output_to_wire(out)
    assert msg.actions.dtype == msg.rollout["log_probs"].dtype == msg.rollout_meta["sigmas"].dtype == "float32"
    assert msg.rollout_meta["step_indices"].dtype == "int64"
    back = convert._outcome(msg)
    assert back.malformed is None and back.rollout["log_probs"].dtype == np.float32


def test_a_rollout_slice_shaped_unlike_the_groups_others_is_retried_not_an_internal_error():
    """Each slice's rollout arrays were checked alone ([n, B, ...]); one whose trailing shape differed from
    an earlier slice's made the reply's np.stack raise: internal_error, the scheduler's fault."""
    fleet = Fleet()
    first = fleet.submit("roll", count=16, rollout=True)  # two slices of 8, one after the other
    fleet.answer(first)
    second = fleet.work[-1]
    assert second is not first
    fleet.answer(second, rollout_len=STEPS + 1)
    _retried_then_done(fleet, "roll", second)
    [reply] = fleet.replies["roll"]
    assert reply.rollout["log_probs"].shape == (16, STEPS)
