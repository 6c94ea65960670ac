"""The queued elastic groups, indexed for the fluid forecast's question: how much pipe time would the
elastic groups queued between two places give back at their minimum counts?

A queued group with a deadline and min_count < its served count may still shrink (core/deadlines.py).
Refusal at receipt and the elastic count ask, per probe, what the startable elastic groups in a
stretch of the queue would give back. Summed group by group, that is a loop over every elastic group
queued -- with a thousand of them, per probe of a binary search, per watched group, it took seconds
an event. Here each forward label keeps its groups in queue order with prefix sums (a Fenwick tree),
so the answer costs O(labels x log groups), whatever the queue holds.

What a group gives back is its extra row-steps, (served - min) x observations x steps, and its extra
slices (each has a fixed cost), which depend on the rows admission slices for: sums are kept for one
slice capacity and rebuilt when asked for another (a worker with fewer rows came or went). Values are
integers, so sums taken apart and put back together are exact.
"""

from __future__ import annotations

import bisect

from candidate_scheduler.core.values import value

_COMPACT_AT = 64  # dead entries in a label's line, beyond its live ones, before it is rebuilt


@value
class ElasticEntry:
    """One queued elastic group, as the index needs it."""

    request_id: str
    order: tuple  # its place in the queue
    label: str  # its forwards' label: the pipe's rate is per label
    extra_rowsteps: int  # (served - min) x observations x steps
    slices: int  # slices it is queued as now
    min_count: int


class _Line:
    """One label's groups in queue order (dead ones left as zeros until compaction), with Fenwick trees
    of their extra row-steps and extra slices."""

    __slots__ = ("orders", "rowsteps", "slices", "tree_r", "tree_s", "dead")

    def __init__(self, entries: list[tuple[tuple, int, int]]):
        """From (order, extra row-steps, extra slices), sorted by order."""
        self.orders = [e[0] for e in entries]
        self.rowsteps = [e[1] for e in entries]
        self.slices = [e[2] for e in entries]
        self.tree_r = _fenwick(self.rowsteps)
        self.tree_s = _fenwick(self.slices)
        self.dead = 0

    def append(self, order: tuple, rowsteps: int, slices: int) -> None:
        """At the end of the line: O(log n), the Fenwick node covers the values before it."""
        i = len(self.orders) + 1
        low = i - (i & -i)
        self.tree_r.append(rowsteps + _prefix(self.tree_r, i - 1) - _prefix(self.tree_r, low))
        self.tree_s.append(slices + _prefix(self.tree_s, i - 1) - _prefix(self.tree_s, low))
        self.orders.append(order)
        self.rowsteps.append(rowsteps)
        self.slices.append(slices)

    def set(self, pos: int, rowsteps: int, slices: int) -> None:
        _add(self.tree_r, pos + 1, rowsteps - self.rowsteps[pos])
        _add(self.tree_s, pos + 1, slices - self.slices[pos])
        self.rowsteps[pos], self.slices[pos] = rowsteps, slices

    def between(self, after: tuple | None, before: tuple) -> tuple[int, int]:
        """Extra row-steps and slices of the groups with after < order < before."""
        lo = 0 if after is None else bisect.bisect_right(self.orders, after)
        hi = bisect.bisect_left(self.orders, before)
        if hi <= lo:
            return 0, 0
        return (_prefix(self.tree_r, hi) - _prefix(self.tree_r, lo),
                _prefix(self.tree_s, hi) - _prefix(self.tree_s, lo))


def _fenwick(values: list[int]) -> list[int]:
    tree = [0, *values]
    for i in range(1, len(tree)):
        j = i + (i & -i)
        if j < len(tree):
            tree[j] += tree[i]
    return tree


def _prefix(tree: list[int], i: int) -> int:
    """The sum of the first i values."""
    total = 0
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


def _add(tree: list[int], i: int, delta: int) -> None:
    while i < len(tree):
        tree[i] += delta
        i += i & -i


class ElasticIndex:
    """The queued groups whose count may still shrink (a set of request ids to its readers), with what
    they would give back between two places in the queue (`between`)."""

    def __init__(self):
        self._entries: dict[str, ElasticEntry] = {}
        self._capacity: int | None = None  # the slice capacity the lines are built for
        self._lines: dict[str, _Line] = {}
        self._where: dict[str, int] = {}  # request id -> its position in its label's line

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def put(self, entry: ElasticEntry) -> None:
        """Index a group, or update one (its count or its slices changed)."""
        old = self._entries.get(entry.request_id)
        self._entries[entry.request_id] = entry
        if self._capacity is None:
            return  # built when first asked
        if old is not None and (old.label, old.order) == (entry.label, entry.order):
            self._lines[entry.label].set(self._where[entry.request_id], *self._values(entry))
            return
        if old is not None:
            self._kill(old)
            if self._capacity is None:
                return  # the kill left its line mostly dead: rebuilt when next asked
        line = self._lines.get(entry.label)
        if line is not None and (not line.orders or entry.order > line.orders[-1]):
            self._where[entry.request_id] = len(line.orders)
            line.append(entry.order, *self._values(entry))
        else:  # a new label, or a group queued ahead of one indexed already: rare, rebuilt
            self._capacity = None

    def discard(self, request_id: str) -> None:
        old = self._entries.pop(request_id, None)
        if old is not None and self._capacity is not None:
            self._kill(old)

    def between(self, after: tuple | None, before: tuple, capacity: int) -> list[tuple[str, int, int]]:
        """(label, extra row-steps, extra slices) over the groups queued with after < order < before (after
        None: from the head), each as if served at its minimum count in slices of `capacity` rows."""
        if self._capacity != capacity:
            self._build(capacity)
        out = []
        for label, line in self._lines.items():
            rowsteps, slices = line.between(after, before)
            if rowsteps or slices:
                out.append((label, rowsteps, slices))
        return out

    def _values(self, e: ElasticEntry) -> tuple[int, int]:
        return e.extra_rowsteps, e.slices - -(-e.min_count // self._capacity)

    def _kill(self, old: ElasticEntry) -> None:
        line = self._lines[old.label]
        line.set(self._where.pop(old.request_id), 0, 0)
        line.dead += 1
        if line.dead > _COMPACT_AT and line.dead > len(line.orders) - line.dead:
            self._capacity = None  # mostly dead: rebuilt when next asked

    def _build(self, capacity: int) -> None:
        self._capacity = capacity
        by_label: dict[str, list[ElasticEntry]] = {}
        for e in self._entries.values():
            by_label.setdefault(e.label, []).append(e)
        self._lines, self._where = {}, {}
        for label, entries in by_label.items():
            entries.sort(key=lambda e: e.order)
            for pos, e in enumerate(entries):
                self._where[e.request_id] = pos
            self._lines[label] = _Line([(e.order, *self._values(e)) for e in entries])
