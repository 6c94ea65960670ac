"""What a client is told: a group's reply (`Result`), and the errors `Client` and `AsyncClient` raise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from candidate_scheduler import protocol


@dataclass
class Result:
    """A group's reply with arrays decoded."""

    request_id: str
    status: str
    action: np.ndarray | None = None
    candidates: np.ndarray | None = None
    candidate_seeds: list[int] = field(default_factory=list)
    chosen_candidate: int | None = None
    error: str | None = None
    error_code: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    served_count: int | None = None  # candidates served (fewer than requested under an elastic count)
    # rollouts: log_probs, latents, next_latents, means, stds, final_latents (candidate axis first),
    # sigmas [T+1], timesteps [T], step_indices [S] (see protocol.RolloutResult)
    rollout: dict[str, np.ndarray] | None = None
    # set by `submit`: why it sent the group again, in order (`reconnected`: the connection dropped, and the
    # run that holds it was asked for its answer again; with `resubmit`, `shutting_down` or `stopping`: a
    # stopping scheduler did not run it, and `unavailable`: it stopped answering); empty when sent once
    resent: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @classmethod
    def from_wire(cls, r: protocol.GroupResult) -> Result:
        return cls(
            request_id=r.request_id,
            status=r.status,
            action=None if r.action is None else _owned(r.action),
            candidates=None if r.candidates is None else _owned(r.candidates),
            candidate_seeds=list(r.candidate_seeds),
            chosen_candidate=r.chosen_candidate,
            error=r.error,
            error_code=r.error_code,
            metrics=dict(r.metrics),
            served_count=r.served_count,
            rollout=None if r.rollout is None else _decode_rollout(r.rollout),
        )

    def to_json(self) -> dict:
        return {
            "request_id": self.request_id,
            "status": self.status,
            "action": None if self.action is None else self.action.tolist(),
            "candidates": None if self.candidates is None else self.candidates.tolist(),
            "candidate_seeds": self.candidate_seeds,
            "served_count": self.served_count,
            "chosen_candidate": self.chosen_candidate,
            "error": self.error,
            "error_code": self.error_code,
            "metrics": self.metrics,
            "rollout": None if self.rollout is None else {k: v.tolist() for k, v in self.rollout.items()},
        }


def _owned(a: protocol.Array) -> np.ndarray:
    """The caller's own, writable copy: a view of the message's bytes is read-only, and the code a reply
    goes to writes in place (`action += offset`) or hands it to torch.from_numpy, which warns that writing
    to a non-writable array is undefined. A reply's arrays are small beside the time it took to make them."""
    return protocol.array_from_wire(a).copy()


def _decode_rollout(r: protocol.RolloutResult) -> dict[str, np.ndarray]:
    out = {name: _owned(getattr(r, name)) for name in r.__struct_fields__ if name != "step_indices"}
    out["step_indices"] = np.asarray(r.step_indices, dtype=np.int64)
    return out


class ServiceError(RuntimeError):
    """The scheduler could not read a message at all (ErrorReply)."""

    def __init__(self, reply: protocol.ErrorReply):
        super().__init__(f"{reply.error_code}: {reply.error}")
        self.reply = reply

    def __reduce__(self):  # pickled (out of a worker process) with the reply it is built from, not its message
        return type(self), (self.reply,)


class Forbidden(PermissionError):
    """The scheduler refused a control request: not this key's right (core/access.py)."""


class SchedulerUnavailable(ConnectionError):
    """The scheduler stopped answering: after `liveness_s` without a word from it, a PING went
    unanswered for `liveness_s` more -- or was answered by another run of it (a restart on the same
    address, faster than the PING: protocol.Pong.incarnation), which never heard of the group. A client
    learns of a dead scheduler within 2 x liveness_s instead of its whole timeout; resubmitting the same
    request id then is safe (core/resubmission.py)."""


class ConnectionDropped(SchedulerUnavailable):
    """The connection to the scheduler dropped and came back while the group was awaited (a network reset,
    or the scheduler's socket closing it), and the same run answers: the reply, unless it came before, went
    to the closed connection and is lost. Send the same request again, under its id: the scheduler answers
    it once, from the group still running or from the reply it kept. `Client.submit` and
    `AsyncClient.submit` do that themselves (`Result.resent`: "reconnected")."""


class ClientClosed(RuntimeError):
    """The client was closed while this call waited on it: no answer will come through it."""
