"""Resubmitting a request id is safe: a group runs at most once per scheduler, and a resubmission gets
its one answer.

A client that lost touch with the scheduler (a timeout, a reconnect, a scheduler that stopped
answering PINGs) sends the same request again, under the same request id. While the group is in
flight, the resubmission waits for the group's one answer (`Group.waiters`); once it has ended, the
answer comes from `ReplyCache`, the last replies kept by request id, and the group is never run
twice. Only the principal that submitted a group (or the client a proxy acted for) may wait on it or
read its kept reply, and only with the same request: the shell fingerprints each SUBMIT's bytes, and a
request id reused for a different request is refused `duplicate_request_id` (an idempotency key reused
with other parameters), as is anyone else's submission under that id, which reveals nothing. After a
scheduler restart nothing is remembered: the resubmitted group runs again, and its seeds being fixed,
gives the same bits.
"""

from __future__ import annotations

import collections
from typing import Any

DEFAULT_REPLIES_KEPT = 1024


class ReplyCache:
    """The last `size` groups' replies, by request id, with the principals they belong to."""

    def __init__(self, size: int = DEFAULT_REPLIES_KEPT):
        self.size = size
        self._kept: collections.OrderedDict[str, tuple[tuple[str, ...], bytes | None, Any]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, request_id: str, owners: tuple[str, ...], fingerprint: bytes | None, result: Any) -> None:
        if self.size <= 0:
            return
        self._kept[request_id] = (owners, fingerprint, result)
        self._kept.move_to_end(request_id)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def get(self, request_id: str, principal: str) -> tuple[bytes | None, Any] | None:
        """(fingerprint, reply) kept for `request_id` when `principal` is one of its owners; else None."""
        kept = self._kept.get(request_id)
        if kept is None or principal not in kept[0]:
            return None
        return kept[1], kept[2]


def same_request(a: bytes | None, b: bytes | None) -> bool:
    """Two submissions under one id are the same request unless both fingerprints are known and differ."""
    return a is None or b is None or a == b
