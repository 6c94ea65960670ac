"""The queue of pending slices, indexed so that a planning pass costs what it places, not what waits.

A pending slice is a *unit* (core/planning.Unit). Units that the planner cannot tell apart -- same
class (the batch key under dispatch batching, the forward key under step batching), same rows, steps
and forward rows -- sit in one *bucket*, sorted by their queue position (`Unit.order`: effective
deadline, then admission order, then slice). A pass reads the queue through a `Walk`: a cursor per
bucket and the earliest head among them, so it visits units in queue order without touching the ones
it never reaches, and drops a whole bucket at once when the rule says none of its units can be
placed this pass (core/planning.py says when). Nothing in a walk mutates the index: a plan is a value.

Adding or removing a unit costs a binary search and a list insertion; units leave mostly from the
front of their bucket (slices start in queue order), which is O(1) here.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable, Iterator
from typing import Any

_COMPACT_AT = 64  # dead entries at a bucket's front before it is compacted


class Bucket:
    """Units that are interchangeable for planning, in queue order."""

    __slots__ = ("key", "class_key", "size", "steps", "cost_rows", "label", "entries", "start")

    def __init__(self, key: tuple, class_key: Hashable, size: int, steps: int, cost_rows: int, label: str):
        self.key, self.class_key, self.size, self.steps, self.cost_rows = key, class_key, size, steps, cost_rows
        self.label = label  # the forward label its units share (the class fixes the shape)
        self.entries: list[tuple] = []  # (order, request_id, slice_index), sorted; live from `start` on
        self.start = 0

    def __len__(self) -> int:
        return len(self.entries) - self.start

    def insert(self, entry: tuple) -> None:
        if not len(self) or entry > self.entries[-1]:
            self.entries.append(entry)  # the common case: groups arrive in deadline order
        else:
            bisect.insort(self.entries, entry, lo=self.start)

    def remove(self, entry: tuple) -> None:
        i = bisect.bisect_left(self.entries, entry, lo=self.start)
        if i >= len(self.entries) or self.entries[i] != entry:
            raise KeyError(entry)
        if i == self.start:
            self.start += 1
            if self.start >= _COMPACT_AT and self.start * 2 >= len(self.entries):
                del self.entries[:self.start]
                self.start = 0
        else:
            del self.entries[i]


class PendingIndex:
    """Pending units by bucket, and by group. `class_of(unit)` says which units may share a batch."""

    def __init__(self, class_of: Callable[[Any], Hashable]):
        self._class_of = class_of
        self._buckets: dict[tuple, Bucket] = {}
        self._units: dict[str, dict[int, Any]] = {}  # request id -> slice index -> unit
        self.candidates = 0  # candidate rows in every pending unit (a gauge, kept as units come and go)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._units

    def add(self, unit) -> None:
        slices = self._units.setdefault(unit.request_id, {})
        if unit.slice_index in slices:
            raise ValueError(f"slice {unit.slice_index} of {unit.request_id!r} is already pending")
        class_key = self._class_of(unit)
        key = (class_key, unit.size, unit.steps, unit.cost_rows)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(key, class_key, unit.size, unit.steps, unit.cost_rows, unit.label)
        bucket.insert((unit.order, unit.request_id, unit.slice_index))
        slices[unit.slice_index] = unit
        self.candidates += unit.size
        self._count += 1

    def discard(self, request_id: str, slice_index: int) -> bool:
        """Remove one pending unit; False when it was not pending."""
        slices = self._units.get(request_id)
        unit = None if slices is None else slices.pop(slice_index, None)
        if unit is None:
            return False
        if not slices:
            del self._units[request_id]
        key = (self._class_of(unit), unit.size, unit.steps, unit.cost_rows)
        bucket = self._buckets[key]
        bucket.remove((unit.order, unit.request_id, unit.slice_index))
        if not len(bucket):
            del self._buckets[key]
        self.candidates -= unit.size
        self._count -= 1
        return True

    def could_join(self, class_key: Hashable | None, free_rows: int) -> bool:
        """Whether a pending unit of this class (None: any) fits in `free_rows` rows."""
        return any(len(b) and b.size <= free_rows and (class_key is None or b.class_key == class_key)
                   for b in self._buckets.values())

    def discard_group(self, request_id: str) -> None:
        for slice_index in list(self._units.get(request_id, ())):
            self.discard(request_id, slice_index)

    def units_of(self, request_id: str) -> list:
        """A group's pending units, in slice order."""
        return [u for _i, u in sorted(self._units.get(request_id, {}).items())]

    def unit(self, request_id: str, slice_index: int):
        return self._units[request_id][slice_index]

    def get(self, request_id: str, slice_index: int):
        """The pending unit of that slice, or None."""
        slices = self._units.get(request_id)
        return None if slices is None else slices.get(slice_index)

    def ahead(self, order: tuple) -> list[tuple[Bucket, int]]:
        """How many units of each bucket are queued ahead of a group at `order` (its own units excluded):
        a binary search per bucket."""
        probe = (order,)  # shorter than any entry with this order: sorts before the group's own units
        out = []
        for bucket in self._buckets.values():
            n = bisect.bisect_left(bucket.entries, probe, lo=bucket.start) - bucket.start
            if n:
                out.append((bucket, n))
        return out

    def sample_behind(self, order: tuple, first: int) -> list[tuple]:
        """A sample of the units queued behind a group at `order` (its own excluded), for a rule that must
        look past a window without walking the queue: in each bucket, of its `first`-th, 4 x `first`-th,
        16 x `first`-th... unit and its last, those behind the group. Counted from each bucket's head, not
        from the group, so groups near the head -- those a planning pass asks about -- share one sample.
        Entries: (unit order, request id, slice index); O(buckets x log queue)."""
        probe = ((*order, math.inf),)  # after every slice of the group's own
        out = []
        for bucket in self._buckets.values():
            entries, start = bucket.entries, bucket.start
            if start >= len(entries) or entries[-1] < probe:
                continue
            step = first
            while start + step < len(entries):
                if entries[start + step - 1] > probe:
                    out.append(entries[start + step - 1])
                step *= 4
            out.append(entries[-1])
        return out

    def walk(self, start: tuple | None = None) -> Walk:
        """A read of the queue in order; with `start` (an order), from the first unit at or after it."""
        return Walk(self, start)

    def ordered(self, start: tuple | None = None) -> Iterator:
        """Every pending unit in queue order (from `start` on), lazily: a walk that takes whatever it finds."""
        walk = self.walk(start)
        while (found := walk.first()) is not None:
            walk.take(found[0])
            yield found[1]


class Walk:
    """One planning pass's read of the index: a cursor per bucket; nothing in the index changes."""

    __slots__ = ("_index", "_pos", "_live")

    def __init__(self, index: PendingIndex, start: tuple | None = None):
        self._index = index
        if start is None:
            self._pos = {key: b.start for key, b in index._buckets.items()}
        else:
            probe = (start,)
            self._pos = {key: bisect.bisect_left(b.entries, probe, lo=b.start) for key, b in index._buckets.items()}
        self._live = [b for key, b in index._buckets.items() if self._pos[key] < len(b.entries)]

    def head(self, bucket: Bucket):
        """The unit at the bucket's cursor (None when the walk has passed its last)."""
        pos = self._pos[bucket.key]
        if pos >= len(bucket.entries):
            return None
        _order, rid, slice_index = bucket.entries[pos]
        return self._index._units[rid][slice_index]

    def first(self, fits: Callable[[Bucket], bool] | None = None) -> tuple[Bucket, Any] | None:
        """The earliest unit at a cursor, among the buckets `fits` accepts: (bucket, unit) or None."""
        best = None
        best_entry = None
        for bucket in self._live:
            pos = self._pos[bucket.key]
            if pos >= len(bucket.entries) or (fits is not None and not fits(bucket)):
                continue
            entry = bucket.entries[pos]
            if best_entry is None or entry < best_entry:
                best, best_entry = bucket, entry
        if best is None:
            return None
        return best, self._index._units[best_entry[1]][best_entry[2]]

    def take(self, bucket: Bucket) -> None:
        """Move past the bucket's head (it was placed, or it was looked at and passed over)."""
        self._pos[bucket.key] += 1
        if self._pos[bucket.key] >= len(bucket.entries):
            self.drop(bucket)

    def drop(self, bucket: Bucket) -> None:
        """Leave a whole bucket out of the rest of the pass."""
        try:
            self._live.remove(bucket)
        except ValueError:
            pass
