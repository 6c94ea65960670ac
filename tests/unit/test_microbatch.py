"""Batch planning: capacity, identity and order, head of line always scheduled."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core.admission import split_balanced
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.microbatch import BatchKey, PhysicalBatch, QueuedGroup, plan_batches

SETTINGS = settings(max_examples=100, deadline=None)
K1 = BatchKey("m", 64, 64, 4, 1.0, "policy", 16, 12)
K2 = BatchKey("m", 64, 64, 4, 1.0, "policy", 16, 13)  # another prompt length: never co-batched with K1


def group(rid, count, capacity, key=K1):
    return QueuedGroup(rid, key, tuple(enumerate(split_balanced(count, capacity))))


@st.composite
def queues(draw):
    capacity = draw(st.integers(1, 8))
    n = draw(st.integers(0, 8))
    items = []
    for i in range(n):
        count = draw(st.integers(1, 20))
        key = draw(st.sampled_from([K1, K2]))
        slices = list(enumerate(split_balanced(count, capacity)))
        # Some slices are already done (e.g. completed before a retry): drop a random subset.
        keep = draw(st.lists(st.booleans(), min_size=len(slices), max_size=len(slices)))
        pending = tuple(s for s, k in zip(slices, keep) if k) or (slices[0],)
        items.append(QueuedGroup(f"g{i}", key, pending))
    return items, capacity


def units_of(queue):
    return [(g.request_id, i, ids) for g in queue for i, ids in sorted(g.pending)]


@SETTINGS
@given(queues())
def test_plan_properties(case):
    queue, capacity = case
    batches = plan_batches(queue, capacity)
    units = units_of(queue)
    position = {(r, i): k for k, (r, i, _) in enumerate(units)}
    planned = [(e.request_id, e.slice_index, e.candidate_ids) for b in batches for e in b.entries]
    # Every pending slice is planned exactly once, whole.
    assert sorted(planned) == sorted(units)
    for b in batches:
        assert 1 <= b.size <= capacity
        keys = {g.key for g in queue for e in b.entries if g.request_id == e.request_id}
        assert keys == {b.key}  # only compatible groups share a batch
        # Stable order: entries in queue order; rows ascending within each entry.
        pos = [position[(e.request_id, e.slice_index)] for e in b.entries]
        assert pos == sorted(pos)
        rows = b.rows()
        assert len(rows) == b.size and len(set(rows)) == len(rows)
    if units:
        # The head of line is always in the first batch, as its first entry.
        head = batches[0].entries[0]
        assert (head.request_id, head.slice_index) == units[0][:2]
    # Batches are ordered by their heads' queue positions, and no unit waits behind more batches
    # than there are units ahead of it (no starvation).
    heads = [position[(b.entries[0].request_id, b.entries[0].slice_index)] for b in batches]
    assert heads == sorted(heads)
    for k, b in enumerate(batches):
        for e in b.entries:
            assert k <= position[(e.request_id, e.slice_index)]


@SETTINGS
@given(queues(), st.integers(1, 3))
def test_max_batches_is_a_prefix_of_the_full_plan(case, limit):
    queue, capacity = case
    assert plan_batches(queue, capacity, max_batches=limit) == plan_batches(queue, capacity)[:limit]


def test_large_head_is_not_overtaken_by_small_groups():
    # A 4-candidate head and a stream of 1-candidate groups behind it, capacity 4: the head goes first.
    queue = [group("big", 4, 4)] + [group(f"s{i}", 1, 4) for i in range(6)]
    batches = plan_batches(queue, 4)
    assert [e.request_id for e in batches[0].entries] == ["big"]
    assert [e.request_id for e in batches[1].entries] == ["s0", "s1", "s2", "s3"]


def test_backfill_behind_the_head_with_same_key_only():
    queue = [group("a", 3, 4), group("b", 2, 4), group("c", 1, 4, key=K2), group("d", 1, 4)]
    batches = plan_batches(queue, 4)
    assert [[(e.request_id, e.candidate_ids) for e in b.entries] for b in batches] == [
        [("a", (0, 1, 2)), ("d", (0,))],
        [("b", (0, 1))],
        [("c", (0,))],
    ]


def test_identity_is_stable_whatever_shares_the_batch():
    alone = plan_batches([group("a", 3, 8)], 8)[0]
    shared = plan_batches([group("z", 2, 8), group("a", 3, 8), group("y", 3, 8)], 8)[0]
    assert [r for r in shared.rows() if r[0] == "a"] == alone.rows() == [("a", 0), ("a", 1), ("a", 2)]
    outputs = np.arange(shared.size * 2, dtype=np.float32).reshape(shared.size, 2)
    pieces = {e.request_id: out for e, out in shared.split(outputs)}
    rows = shared.rows()
    for rid, out in pieces.items():
        expected = outputs[[i for i, r in enumerate(rows) if r[0] == rid]]
        np.testing.assert_array_equal(out, expected)
    with pytest.raises(CandidateContractError):
        shared.split(outputs[:-1])
    with pytest.raises(CandidateContractError):
        shared.split(outputs, rows=list(reversed(rows)))
    assert len(shared.split(list(range(shared.size)), rows=rows)) == 3


def test_tuple_queue_items_and_errors():
    batches = plan_batches([("a", K1, [(0, [0, 1]), (1, [2])])], 2)
    assert [b.rows() for b in batches] == [[("a", 0), ("a", 1)], [("a", 2)]]
    with pytest.raises(CandidateContractError) as info:
        plan_batches([group("a", 4, 4)], 3)  # a slice is never split
    assert info.value.code == "does_not_fit"
    with pytest.raises(CandidateContractError):
        plan_batches([group("a", 1, 4), group("a", 1, 4)], 4)
    with pytest.raises(CandidateContractError):
        plan_batches([], 0)
    assert plan_batches([], 4) == []
    assert isinstance(plan_batches([group("a", 1, 4)], 4)[0], PhysicalBatch)
