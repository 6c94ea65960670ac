"""The indexed queue (core/pending.py) and the planners that read it (core/planning.py).

The planners are checked against the list-walking planners they replaced (kept here as the reference,
as they stood before the index): on random queues and workers, the same placements in the same order.
And a pass looks only at what it places, whatever waits behind."""

from __future__ import annotations

import itertools
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.core import planning
from candidate_scheduler.core.microbatch import QueuedGroup, plan_batches
from candidate_scheduler.core.pending import PendingIndex
from candidate_scheduler.core.planning import Unit, WorkerSlot, dispatch_class, plan_dispatch, plan_step, step_class

KEYS = ((64, 64, 16, 5, "policy", False), (128, 128, 16, 5, "policy", False))


def unit(rid: str, size: int, *, order: int, slice_index: int = 0, steps: int = 4, fkey: int = 0, obs: int = 1) -> Unit:
    forward_key = KEYS[fkey]
    return Unit(rid, slice_index, tuple(range(size)), (forward_key, steps), forward_key, (float(order), order, slice_index),
                steps, size * obs, f"label{fkey}")


def index_of(units, mode: str = "step") -> PendingIndex:
    index = PendingIndex(step_class if mode == "step" else dispatch_class)
    for u in units:
        index.add(u)
    return index


# ---- the reference: the planners as they were, over a list in queue order ------------------------------


def reference_step(units, workers, backfill=None):
    placements, reserved = [], {}
    for u in units:
        open_ = [w for w in workers if w.accepts(u) and (
            w.worker_id not in reserved or (backfill is not None and u.size <= w.free_rows
                                            and backfill(w.worker_id, reserved[w.worker_id], u)))]
        if open_:
            best = min(open_, key=lambda w: (w.free_rows, w.forward_key is None))
            best.free_rows -= u.size
            best.forward_key = u.forward_key
            placements.append((best.worker_id, u))
            continue
        holders = [w for w in workers if w.worker_id not in reserved and w.capacity >= u.size]
        if holders:
            reserved[max(holders, key=lambda w: w.free_rows).worker_id] = u
        if len(reserved) == len(workers) and backfill is None:
            break
    return placements


def reference_dispatch(units, idle):
    plans, remaining = [], list(units)
    for worker in sorted(idle, key=lambda w: -w.capacity):
        queued, keys = {}, {}
        for u in remaining:
            if u.size <= worker.capacity:
                queued.setdefault(u.request_id, []).append((u.slice_index, u.candidate_ids))
                keys[u.request_id] = u.batch_key
        if not queued:
            break
        batch = plan_batches([QueuedGroup(rid, keys[rid], tuple(p)) for rid, p in queued.items()], worker.capacity,
                             max_batches=1)
        plans.append((worker.worker_id, tuple((e.request_id, e.slice_index) for e in batch[0].entries)))
        taken = set(plans[-1][1])
        remaining = [u for u in remaining if (u.request_id, u.slice_index) not in taken]
    return plans


# ---- random queues and workers ---------------------------------------------------------------------------

queues = st.lists(st.tuples(st.integers(1, 4), st.sampled_from([4, 10]), st.integers(0, 1), st.integers(1, 2)),
                  min_size=0, max_size=40)
fleets = st.lists(st.tuples(st.integers(4, 8), st.integers(0, 8), st.integers(0, 1)), min_size=1, max_size=4)


def build(queue_spec, fleet_spec):
    units = [unit(f"g{i}", size, order=i, steps=steps, fkey=fkey, obs=obs)
             for i, (size, steps, fkey, obs) in enumerate(queue_spec)]

    def slots():
        out = []
        for j, (cap, free, fkey) in enumerate(fleet_spec):
            free = min(free, cap)
            out.append(WorkerSlot(f"w{j}", cap, free, None if free == cap else KEYS[fkey]))
        return out
    return units, slots


def deterministic_backfill(worker_id: str, head: Unit, u: Unit) -> bool:
    # a function of what a bucket shares (steps, rows) and of the head's rows, as the real one is
    return (int(worker_id[1:]) + head.size + u.steps + u.cost_rows) % 3 == 0


@settings(max_examples=300, deadline=None)
@given(queues, fleets, st.booleans())
def test_plan_step_places_what_the_list_walking_planner_placed(queue_spec, fleet_spec, with_backfill):
    units, slots = build(queue_spec, fleet_spec)
    backfill = deterministic_backfill if with_backfill else None
    want = [(w, u.request_id) for w, u in reference_step(units, slots(), backfill)]
    got = [(w, u.request_id) for w, u in plan_step(index_of(units), slots(), backfill)]
    assert got == want


big_fleets = st.lists(st.tuples(st.integers(4, 8), st.integers(0, 8), st.integers(0, 1), st.integers(0, 8)),
                      min_size=1, max_size=24)
wide_queues = st.lists(st.tuples(st.integers(1, 8), st.sampled_from([4, 10]), st.integers(0, 1), st.integers(1, 2)),
                       min_size=0, max_size=40)  # units as wide as a worker: some fit only a larger one


@settings(max_examples=400, deadline=None)
@given(wide_queues, big_fleets, st.booleans())
def test_a_step_pass_on_many_slots_places_what_the_scan_placed(queue_spec, fleet_spec, with_backfill):
    """Past SCAN_LIMIT slots a unit's best slot comes from an index (planning._SlotIndex): the same
    placements as the scan, spare rows (prefetch), reservations and backfill included."""
    units = [unit(f"g{i}", size, order=i, steps=steps, fkey=fkey, obs=obs)
             for i, (size, steps, fkey, obs) in enumerate(queue_spec)]

    def slots():
        return [WorkerSlot(f"w{j}", cap, min(free, cap), None if min(free, cap) == cap else KEYS[fkey], spare)
                for j, (cap, free, fkey, spare) in enumerate(fleet_spec)]

    backfill = deterministic_backfill if with_backfill else None
    placed = {}
    for limit in (0, 10**9):  # the index for every pass, then the scan for every pass
        with mock.patch.object(planning, "SCAN_LIMIT", limit):
            placed[limit] = [(w, u.request_id) for w, u in plan_step(index_of(units), slots(), backfill)]
    assert placed[0] == placed[10**9]


@settings(max_examples=300, deadline=None)
@given(queues, fleets)
def test_plan_dispatch_places_what_the_list_walking_planner_placed(queue_spec, fleet_spec):
    units, slots = build(queue_spec, fleet_spec)
    idle = [s for s in slots() if s.forward_key is None]
    want = reference_dispatch(units, idle)
    got = [(wid, tuple((u.request_id, u.slice_index) for u in batch))
           for wid, batch in plan_dispatch(index_of(units, "dispatch"), idle)]
    assert got == want


def test_the_index_keeps_queue_order_and_a_walk_changes_nothing():
    index = index_of([unit("c", 1, order=3), unit("a", 2, order=1), unit("b", 1, order=2, fkey=1)])
    assert [u.request_id for u in index.ordered()] == ["a", "b", "c"]
    assert [u.request_id for u in index.ordered()] == ["a", "b", "c"]  # reading it twice: the same
    assert len(index) == 3 and index.candidates == 4
    assert index.discard("a", 0) and not index.discard("a", 0)
    index.add(unit("a", 2, order=1))  # a retried slice regains its place
    assert [u.request_id for u in index.ordered()] == ["a", "b", "c"]
    index.discard_group("c")
    assert [u.request_id for u in index.ordered()] == ["a", "b"] and index.candidates == 3


def test_units_leaving_from_the_front_keep_the_order_of_what_remains():
    index = index_of([unit(f"g{i}", 1, order=i) for i in range(500)])
    for i in range(0, 400):
        assert index.discard(f"g{i}", 0)
    index.discard("g450", 0)  # and one from the middle
    assert [u.request_id for u in index.ordered()] == [f"g{i}" for i in range(400, 500) if i != 450]


def test_a_step_pass_looks_only_at_what_it_places():
    # 10,000 queued one-row units over two shapes and two step counts; 32 workers, one free row between them
    units = [unit(f"g{i}", 1, order=i, steps=(4, 10)[i % 2], fkey=(i // 2) % 2) for i in range(10_000)]
    index = index_of(units)
    slots = [WorkerSlot(f"w{j}", 8, 1 if j == 7 else 0, KEYS[0]) for j in range(32)]
    seen = []
    placed = plan_step(index, slots, deterministic_backfill, seen.append)
    assert [u.request_id for _w, u in placed] == ["g0"]
    assert len(seen) <= 2 + len(slots) + 4  # one placed, one per reservation, one per bucket left


def test_a_dispatch_pass_stops_with_the_idle_workers():
    units = [unit(f"g{i}", 1 + i % 3, order=i) for i in range(10_000)]
    seen = []
    plans = plan_dispatch(index_of(units, "dispatch"), [WorkerSlot("w0", 8, 8, None)], seen.append)
    rows = sum(u.size for u in plans[0][1])
    assert rows == 8 and len(seen) == len(plans[0][1])


def test_orders_are_unique_per_slice():
    # the engine's orders are (effective deadline, admission order, slice): never two equal entries
    orders = [u.order for u in (unit("a", 1, order=1, slice_index=i) for i in range(3))]
    assert len(set(orders)) == 3 and orders == sorted(orders)
    assert list(itertools.islice(index_of([unit("a", 1, order=1, slice_index=i) for i in (2, 0, 1)]).ordered(), 3)) \
        == [unit("a", 1, order=1, slice_index=i) for i in (0, 1, 2)]


def test_a_sample_behind_a_group_is_every_bucket_at_four_fold_distances_from_its_head_and_its_last():
    index = PendingIndex(lambda u: u.batch_key)
    for g in range(100):
        for key in ("a", "b"):
            if key == "b" and g % 10:
                continue  # bucket b: every tenth group
            index.add(Unit(f"{key}{g}", 0, (0,), key, key, (float(g), g, 0), 4, 1, "L"))
    got = index.sample_behind((5.0, 5), 4)
    a = [e[1] for e in got if e[1].startswith("a")]
    b = [e[1] for e in got if e[1].startswith("b")]
    # a's 4th, 16th and 64th units from its head are a3, a15, a63; a3 is ahead of a5; then its last
    assert a == ["a15", "a63", "a99"]
    assert b == ["b30", "b90"]  # b's 4th unit, then its last (it has no 16th)
    assert index.sample_behind((99.0, 99), 4) == []  # nothing behind the last group
    for g in range(20):  # the heads leave: the sample moves with them
        index.discard(f"a{g}", 0)
    assert [e[1] for e in index.sample_behind((5.0, 5), 4) if e[1].startswith("a")] == ["a23", "a35", "a83", "a99"]
