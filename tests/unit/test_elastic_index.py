"""The elastic index (core/elastic_index.py): what the queued elastic groups between two places would give
back, kept as prefix sums, must equal the sum taken group by group however groups come, change and go."""

import random

from candidate_scheduler.core.elastic_index import ElasticEntry, ElasticIndex


def _brute(entries: dict[str, ElasticEntry], after, before, capacity: int) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for e in entries.values():
        if (after is None or after < e.order) and e.order < before:
            r, s = out.get(e.label, (0, 0))
            out[e.label] = (r + e.extra_rowsteps, s + e.slices - -(-e.min_count // capacity))
    return {k: v for k, v in out.items() if v != (0, 0)}


def _entry(rng: random.Random, rid: str, order: tuple) -> ElasticEntry:
    served = rng.randint(2, 32)
    min_count = rng.randint(1, served - 1)
    return ElasticEntry(rid, order, rng.choice(("a", "b", "c")), (served - min_count) * rng.randint(1, 20),
                        -(-served // 8), min_count)


def test_between_equals_the_group_by_group_sum_through_puts_updates_discards_and_capacities():
    rng = random.Random(7)
    index, truth = ElasticIndex(), {}
    admitted = 0
    for step in range(3000):
        action = rng.random()
        if action < 0.45 or not truth:
            admitted += 1
            # mostly in deadline order (appended), sometimes ahead of groups indexed already
            deadline = admitted * 0.01 if rng.random() < 0.8 else rng.uniform(0, admitted * 0.01)
            e = _entry(rng, f"g{admitted}", (deadline, admitted))
            index.put(e)
            truth[e.request_id] = e
        elif action < 0.6:  # a resize, or a re-slice: same group, same place
            rid = rng.choice(list(truth))
            e = _entry(rng, rid, truth[rid].order)
            e = ElasticEntry(rid, e.order, truth[rid].label, e.extra_rowsteps, e.slices, e.min_count)
            index.put(e)
            truth[rid] = e
        else:  # started or forgotten: the head mostly
            rid = min(truth, key=lambda r: truth[r].order) if rng.random() < 0.7 else rng.choice(list(truth))
            index.discard(rid)
            del truth[rid]
        assert set(index) == set(truth) and len(index) == len(truth)
        if step % 7 == 0:
            capacity = rng.choice((8, 8, 8, 4))
            orders = sorted(e.order for e in truth.values()) or [(0.0, 0)]
            after = None if rng.random() < 0.3 else rng.choice(orders)
            before = rng.choice([*orders, (float("inf"), 0)])
            got = {label: (r, s) for label, r, s in index.between(after, before, capacity)}
            assert got == _brute(truth, after, before, capacity), step


def test_a_group_queued_at_an_order_is_not_counted_by_a_question_at_that_order():
    """Strictly between: a group is not ahead of itself."""
    index = ElasticIndex()
    index.put(ElasticEntry("x", (1.0, 1), "a", 40, 1, 2))
    index.put(ElasticEntry("y", (2.0, 2), "a", 10, 2, 2))
    assert index.between(None, (1.0, 1), 8) == []
    assert index.between((1.0, 1), (2.0, 2), 8) == []
    assert index.between(None, (2.0, 2), 8) == [("a", 40, 0)]
    assert index.between(None, (3.0, 3), 8) == [("a", 50, 1)]
    index.discard("x")
    assert index.between(None, (3.0, 3), 8) == [("a", 10, 1)]
    assert "x" not in index and "y" in index
