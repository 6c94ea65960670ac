"""Resubmitting a request id is safe: a group runs at most once per scheduler, and a resubmission gets
its one answer.

A client that lost touch with the scheduler (a timeout, a reconnect, a scheduler that stopped
answering PINGs) sends the same request again, under the same request id. While the group is in
flight, the resubmission waits for the group's one answer (`Group.waiters`); once it has ended, the
answer comes from `ReplyCache`, the last replies kept by request id, and the group is never run
twice. Only the principal that submitted a group (or the client a proxy acted for) may wait on it or
read its kept reply; anyone else's submission under that id is refused `duplicate_request_id`, which
reveals nothing. After a scheduler restart nothing is remembered: the resubmitted group runs again,
and its seeds being fixed, gives the same bits.
"""

from __future__ import annotations

import collections
from typing import Any

DEFAULT_REPLIES_KEPT = 1024


class ReplyCache:
    """The last `size` groups' replies, by request id, with the principals they belong to."""

    def __init__(self, size: int = DEFAULT_REPLIES_KEPT):
        self.size = size
        self._kept: collections.OrderedDict[str, tuple[tuple[str, ...], Any]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, request_id: str, owners: tuple[str, ...], result: Any) -> None:
        if self.size <= 0:
            return
        self._kept[request_id] = (owners, result)
        self._kept.move_to_end(request_id)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def get(self, request_id: str, principal: str) -> Any | None:
        """The kept reply of `request_id` when `principal` is one of its owners; None otherwise."""
        kept = self._kept.get(request_id)
        if kept is None or principal not in kept[0]:
            return None
        return kept[1]
