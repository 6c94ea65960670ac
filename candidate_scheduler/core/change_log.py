"""What changed, in order, for readers that catch up later (core/fleet_terms.py reads two: the workers
whose planning view was rebuilt, and those whose cost model learnt).

A reader keeps the `stamp` it has read up to and asks `since(stamp)`. The log keeps the last `keep`
entries at least; a reader that fell further behind, or one from before `restart`, gets None and starts
over from the whole state. That bounds the memory without any reader having to say it is done.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class ChangeLog(Generic[T]):
    def __init__(self, keep: int = 4096) -> None:
        self.stamp = 0  # entries appended (and restarts) so far
        self._keep = keep
        self._start = 0  # the stamp of self._items[0]
        self._items: list[T] = []

    def append(self, item: T) -> None:
        self._items.append(item)
        self.stamp += 1
        if len(self._items) > 2 * self._keep:  # trimmed in halves: amortised O(1) per entry
            del self._items[:-self._keep]
            self._start = self.stamp - self._keep

    def restart(self) -> None:
        """Everything changed (e.g. the workers' positions moved): every reader starts over."""
        self._items.clear()
        self.stamp += 1
        self._start = self.stamp

    def since(self, stamp: int) -> list[T] | None:
        """The entries appended after `stamp`, oldest first; None if they are no longer all kept."""
        if stamp < self._start or stamp > self.stamp:
            return None
        return self._items[stamp - self._start:]
