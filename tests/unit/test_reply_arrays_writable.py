"""A client's decoded reply arrays are its own and writable (service/replies.py `Result.from_wire`): they
were read-only views of the message's bytes, so `result.action += offset` raised and torch.from_numpy
warned that writing to them is undefined -- what RL code does with rollout log-probs and latents."""

from __future__ import annotations

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.service.replies import Result


def test_every_array_of_a_decoded_reply_is_writable_and_equal_to_what_was_sent():
    action = np.arange(12, dtype=np.float32).reshape(3, 4)
    candidates = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    rollout = protocol.RolloutResult(**{name: protocol.array_to_wire(np.ones((2, 1), np.float32) * i)
                                        for i, name in enumerate(protocol.ROLLOUT_FIELDS)},
                                     sigmas=protocol.array_to_wire(np.linspace(1, 0, 3, dtype=np.float32)),
                                     timesteps=protocol.array_to_wire(np.arange(2, dtype=np.float32)),
                                     step_indices=[0])
    sent = protocol.GroupResult("g", "done", action=protocol.array_to_wire(action),
                                candidates=protocol.array_to_wire(candidates), rollout=rollout)
    r = Result.from_wire(sent)
    for name, arr in {"action": r.action, "candidates": r.candidates, **r.rollout}.items():
        assert arr.flags.writeable, name
    r.action += 1.0  # raised "assignment destination is read-only"
    assert np.array_equal(r.action, action + 1.0) and np.array_equal(r.candidates, candidates)
    assert np.array_equal(r.rollout["sigmas"], np.linspace(1, 0, 3, dtype=np.float32))
