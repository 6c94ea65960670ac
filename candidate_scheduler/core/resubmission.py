"""Resubmitting a request id is safe: a group runs at most once per scheduler, and a resubmission gets
its one answer.

A client that lost touch with the scheduler (a timeout, a reconnect, a scheduler that stopped
answering PINGs) sends the same request again, under the same request id. While the group is in
flight, the resubmission waits for the group's one answer (`Group.waiters`); once it has ended, the
answer comes from `ReplyCache`, the last replies kept by request id, and the group is never run
twice. Only the principal that submitted a group (or the client a proxy acted for) may wait on it or
read its kept reply, and only with the same request: the shell fingerprints each SUBMIT's bytes, and a
request id reused for a different request is refused `duplicate_request_id` (an idempotency key reused
with other parameters), as is anyone else's submission under that id, which reveals nothing (with keys
the shell gives each principal ids of its own, core/request_scope.py: "anyone else" is then another
client of the same proxy, in the proxy's namespace). After a
scheduler restart nothing is remembered: the resubmitted group runs again, and its seeds being fixed,
gives the same bits.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

DEFAULT_REPLIES_KEPT = 1024
# Connections a group in flight answers besides its sender's (`Group.waiters`). A client that reconnects
# resubmits from a new connection each time, so a long group behind a flapping link collects one per
# reconnect, nearly all of them gone; past this many the oldest is forgotten, the newest kept.
MAX_WAITERS = 16
# and at most this many bytes of their arrays: 1,024 replies with candidates or rollouts (latents at every
# step) can weigh gigabytes; past it the oldest go, and a resubmission of one runs again (the same bits)
DEFAULT_REPLIES_KEPT_BYTES = 256 * 2**20


class ReplyCache:
    """The last `size` groups' replies (their arrays `max_bytes` at most), by request id, with the
    principals they belong to."""

    def __init__(self, size: int = DEFAULT_REPLIES_KEPT, max_bytes: int = DEFAULT_REPLIES_KEPT_BYTES):
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: collections.OrderedDict[str, tuple[tuple[str, ...], bytes | None, Any]] = collections.OrderedDict()
        self._weights: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, request_id: str, owners: tuple[str, ...], fingerprint: bytes | None, result: Any) -> None:
        if self.size <= 0:
            return
        self.bytes -= self._weights.pop(request_id, 0)
        self._kept[request_id] = (owners, fingerprint, result)
        self._kept.move_to_end(request_id)
        self._weights[request_id] = weight = array_bytes(result)
        self.bytes += weight
        while self._kept and (len(self._kept) > self.size or self.bytes > self.max_bytes):
            gone, _ = self._kept.popitem(last=False)
            self.bytes -= self._weights.pop(gone)

    def get(self, request_id: str, principal: str) -> tuple[bytes | None, Any] | None:
        """(fingerprint, reply) kept for `request_id` when `principal` is one of its owners; else None."""
        kept = self._kept.get(request_id)
        if kept is None or principal not in kept[0]:
            return None
        return kept[1], kept[2]


def array_bytes(result: Any) -> int:
    """The bytes of a reply's arrays (its candidates, action, rollout); the rest is small. (Read field by
    field: it runs for every group answered.)"""
    total = 0
    for a in (getattr(result, "action", None), getattr(result, "candidates", None)):
        if a is not None:
            total += a.nbytes
    rollout = getattr(result, "rollout", None)
    if rollout:
        total += sum(a.nbytes for a in rollout.values() if isinstance(a, np.ndarray))
    return total


def same_request(a: bytes | None, b: bytes | None) -> bool:
    """Two submissions under one id are the same request unless both fingerprints are known and differ."""
    return a is None or b is None or a == b
