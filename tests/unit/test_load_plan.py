"""The load benchmark's pure parts: arrival schedules, the early-stop bound, flag parsing, rows per forward,
capacity brackets, and which plan the comparison point runs."""

from __future__ import annotations

import numpy as np
import pytest

from candidate_scheduler.bench.load_arms import rows_per_forward
from candidate_scheduler.bench.load_plan import (
    COUNTS,
    FULL,
    arrivals,
    group_sequence,
    parse_arm_flags,
    scaled,
    unloaded_groups,
)
from candidate_scheduler.bench.load_point import over_slo_needed


def test_group_sequence_is_fixed_and_mixes_the_counts():
    a, b = group_sequence(64), group_sequence(64)
    assert a == b  # every arm and every run gets the same groups
    assert group_sequence(256) != a  # each shape its own
    counts = np.asarray([g.count for g in a])
    assert set(counts) == set(COUNTS)
    for c in COUNTS:  # uniform over the four counts
        assert abs(np.mean(counts == c) - 0.25) < 0.03
    assert abs(np.mean([g.gap for g in a]) - 1.0) < 0.05  # unit-rate Poisson gaps


def test_arrivals_time_scale_one_sequence():
    seq = group_sequence(64)
    slow = arrivals(seq, rate=2.0, window_s=10.0, min_groups=4, max_window_s=100.0)
    fast = arrivals(seq, rate=4.0, window_s=10.0, min_groups=4, max_window_s=100.0)
    assert len(slow) == 20 and len(fast) == 40  # rate * window groups
    assert [g for _at, g in slow] == [g for _at, g in fast][:20]  # the same groups, in the same order
    assert np.allclose([at for at, _g in slow], [2 * at for at, _g in fast][:20])
    assert all(b > a for (a, _), (b, _) in zip(slow, slow[1:]))


def test_arrivals_stretch_to_the_minimum_but_stop_at_the_cap():
    seq = group_sequence(64)
    low = arrivals(seq, rate=0.5, window_s=4.0, min_groups=10, max_window_s=1000.0)
    assert len(low) == 10  # 0.5 * 4 = 2 groups stretched to 10
    capped = arrivals(seq, rate=0.5, window_s=4.0, min_groups=10, max_window_s=5.0)
    assert 1 <= len(capped) < 10 and all(at <= 5.0 for at, _g in capped[1:])
    with pytest.raises(ValueError):
        arrivals(seq, rate=0.0, window_s=1.0, min_groups=1, max_window_s=1.0)


def test_over_slo_needed_forces_the_p99_over_the_bound():
    for n in (1, 2, 5, 10, 40, 99, 100, 101, 250):
        k = over_slo_needed(n)
        assert 1 <= k <= n
        forced = np.zeros(n)
        forced[n - k:] = 1.0 + 1e-6  # k latencies just over a bound of 1: the p99 is over it
        assert np.percentile(forced, 99) > 1.0, n
        short = np.zeros(n)
        short[n - k + 1:] = 1.0 + 1e-6  # one fewer: the p99 can still be within it
        assert np.percentile(short, 99) <= 1.0, n


def test_unloaded_groups_cover_every_count_per_repeat():
    groups = unloaded_groups(64, 3)
    assert [g.count for g in groups] == list(COUNTS) * 3
    assert len({g.index for g in groups}) == len(groups)  # each its own observation


def test_arm_flags_default_override_and_refuse_unknown_arms():
    flags = parse_arm_flags([])
    assert flags == {"dispatch": ("--batching", "dispatch"), "step": ("--batching", "step"),
                     "step_inline": ("--batching", "step")}
    flags = parse_arm_flags(["dispatch=", "step=--batching step --max-queued-groups 4096"])
    assert flags["dispatch"] == () and flags["step"] == ("--batching", "step", "--max-queued-groups", "4096")
    for bad in (["sglang_sequential=--x"], ["step"]):
        with pytest.raises(SystemExit):
            parse_arm_flags(bad)


def test_scaled_plan_lengthens_every_window():
    doubled = scaled(FULL, 2.0)
    for a, b in zip(FULL.shapes, doubled.shapes):
        assert b.window_s == 2 * a.window_s and b.max_window_s == 2 * a.max_window_s
        assert b.min_groups == 2 * a.min_groups and b.sweep == a.sweep
    assert scaled(FULL, 1.0) is FULL


def test_rows_per_forward_prefers_the_per_forward_histogram():
    before = {"cs_forward_rows_sum": 10.0, "cs_forward_rows_count": 5.0, "cs_batch_rows_sum": 4.0,
              "cs_batch_rows_count": 2.0}
    after = {"cs_forward_rows_sum": 70.0, "cs_forward_rows_count": 15.0, "cs_batch_rows_sum": 40.0,
             "cs_batch_rows_count": 8.0}
    assert rows_per_forward(before, after) == (6.0, "forward_rows histogram")
    no_forwards = {k: v for k, v in after.items() if "forward" not in k}
    assert rows_per_forward({}, no_forwards) == (5.0, "batch_rows histogram")
    assert rows_per_forward(after, after) == (None, None)  # nothing ran in between


def test_the_comparison_point_runs_longer_than_a_sweep_point():
    shape = FULL.shapes[0]
    compare = shape.compare_plan()
    assert (compare.window_s, compare.max_window_s, compare.min_groups) == (
        shape.window_s * shape.compare_scale, shape.max_window_s * shape.compare_scale,
        round(shape.min_groups * shape.compare_scale))
    # at a typical 64x64 comparison rate its p99 is over dozens of groups, not a handful
    sweep = arrivals(group_sequence(64), 2.9, shape.window_s, shape.min_groups, shape.max_window_s)
    longer = arrivals(group_sequence(64), 2.9, compare.window_s, compare.min_groups, compare.max_window_s)
    assert len(sweep) < 20 and len(longer) >= 50
    assert FULL.shapes[1].compare_plan() == FULL.shapes[1]  # 256x256: as a sweep point


def test_the_consistent_capacity_is_the_highest_pass_below_the_lowest_failure_of_every_point():
    from candidate_scheduler.bench.load_report import consistent_capacity

    def rows(*points):
        return [{"offered_groups_per_s": rate, "p99_within_slo": ok} for rate, ok in points]

    # the search passed 4.7, but a longer point at 3.3 failed: 2.9 is what every point agrees on
    assert consistent_capacity(rows((1.4, True), (2.9, True), (3.3, False), (4.7, True), (5.6, False))) == 2.9
    assert consistent_capacity(rows((1.0, True), (1.5, True))) == 1.5  # nothing failed
    assert consistent_capacity(rows((1.0, False), (2.0, True))) is None  # the lowest point failed
    assert consistent_capacity([]) is None


def test_a_capacity_ratio_counts_as_resolved_only_when_the_brackets_do_not_overlap():
    from candidate_scheduler.bench.load_report import bracket_verdict, capacity_bracket

    def rows(*points):
        return [{"offered_groups_per_s": rate, "p99_within_slo": ok} for rate, ok in points]

    # the committed 256x256 run: dispatch passed 2.19 and failed 2.58, step passed 1.94 and failed 2.28
    dispatch = capacity_bracket(rows((1.82, True), (2.19, True), (2.58, False), (3.64, False)))
    step = capacity_bracket(rows((1.61, True), (1.94, True), (2.28, False), (3.23, False)))
    assert dispatch == (2.19, 2.58) and step == (1.94, 2.28)
    assert bracket_verdict(step, dispatch).startswith("not resolved")
    # 64x64: step passed 9.56, above the 9.46 dispatch failed
    assert bracket_verdict(capacity_bracket(rows((9.56, True), (11.48, False))),
                           capacity_bracket(rows((7.89, True), (9.46, False)))).startswith("`step` above")
    assert bracket_verdict((1.0, 1.5), (2.0, None)).startswith("`step` below")  # dispatch failed nothing
    assert bracket_verdict((3.0, None), (2.0, None)).startswith("not resolved")  # nothing above either failed
    assert bracket_verdict((None, 1.0), (2.0, 3.0)) is None  # step's lowest point failed: no bracket


def test_only_the_compared_arms_below_their_capacity_run_the_long_comparison_point(monkeypatch):
    from types import SimpleNamespace

    from candidate_scheduler.bench.load_shape import ShapeBench

    shape = FULL.shapes[0]
    bench = ShapeBench(shape, FULL, {"dispatch": None, "step": None, "sglang_sequential": None}, None, None, 1)
    calls = []
    monkeypatch.setattr(bench, "point", lambda arm, rate, slo, phase, **kw: calls.append((arm.name, kw)) or {})
    bench.compare(SimpleNamespace(name="dispatch"), 5.5, 7.9, 2.0, [])  # below its own capacity: 4x as long
    bench.compare(SimpleNamespace(name="sglang_sequential"), 5.5, 3.0, 9.0, [])  # 1.8x its capacity
    bench.compare(SimpleNamespace(name="step"), 5.5, 3.0, 9.0, [])  # a compared arm, 1.8x its capacity
    # No target reads sglang_sequential's p99 there: a sweep point's length, even below its capacity
    # (0.94x of it in a full run, where the long window's backlog took 45 s to drain)
    bench.compare(SimpleNamespace(name="sglang_sequential"), 5.08, 5.38, 9.0, [])
    assert calls[0][1] == {"early_stop": False, "shape": shape.compare_plan()}
    assert calls[1][1] == {"early_stop": True, "shape": None}  # point() then uses the sweep's own plan
    assert calls[2][1] == {"early_stop": True, "shape": None}
    assert calls[3][1] == {"early_stop": False, "shape": None}
