"""The deadline policy (core/deadlines.py) in simulated time: the real engine against a simulated 8-row
worker that runs its batch exactly as the forecast models it (bench/deadline_sim.py, the `fluid` worker).
Whatever misses here is the policy's doing, not the cost model's error.

Step times are the tiny checkpoint's on this machine (64x64, 10 steps): a count-8 group takes 0.28 s
alone, four count-2 groups share a forward of 8 rows. Every deadline is 3x the count-8 latency."""

from __future__ import annotations

from candidate_scheduler.bench.deadline_sim import simulate, summarize_sim
from candidate_scheduler.bench.open_loop import poisson_schedule

STEP_S = {2: 0.011, 8: 0.027}
SAMPLING = {"height": 64, "width": 64, "steps": 10, "horizon": 16}
OVERHEAD_S = 0.01
LATENCY_8 = OVERHEAD_S + SAMPLING["steps"] * STEP_S[8]
DEADLINE_S = 3 * LATENCY_8
MU = 1 / LATENCY_8  # count-8 groups per second one worker can serve


def test_a_burst_of_elastic_groups_shrinks_queued_counts_to_make_room():
    # Six groups within 50 ms. At count 8 only three fit the deadline (0.27, 0.54, 0.81 s), and a fixed
    # arm refuses the rest at once. Elastic ones (min_count 2) must all be admitted: the groups still
    # queued ahead of a newcomer shrink to make room for it (forecast at receipt with every queued
    # elastic group at its minimum, and counts chosen behind the groups queued ahead).
    arrivals = [0.01 * i for i in range(6)]
    fixed = simulate(arrivals, 8, DEADLINE_S, STEP_S, SAMPLING, overhead_s=OVERHEAD_S)["outcomes"]
    assert [o["status"] for o in fixed] == ["done"] * 3 + ["rejected"] * 3
    assert all(o["error_code"] == "deadline_unmeetable" for o in fixed[3:])
    elastic = simulate(arrivals, 2, DEADLINE_S, STEP_S, SAMPLING, overhead_s=OVERHEAD_S)["outcomes"]
    assert [o["status"] for o in elastic] == ["done"] * 6, elastic
    assert all(o["latency_s"] <= DEADLINE_S for o in elastic)
    served = [o["served_count"] for o in elastic]
    assert served[0] == 8 and min(served) == 2 and sum(served) < 6 * 8


def test_elastic_groups_are_not_refused_at_one_and_a_half_times_the_fixed_saturation():
    # At count 2 four groups share the worker's 8 rows: 1.5x the rate at which count-8 groups saturate
    # it leaves room for every elastic group, and none may be refused at receipt (the fixed arm is
    # refused a third of the time). Before the queued elastic groups counted at their minimum in the
    # refusal forecast, about a quarter of the elastic groups were refused too.
    arrivals = poisson_schedule(1.5 * MU, 60.0, seed=7)
    fixed = summarize_sim(simulate(arrivals, 8, DEADLINE_S, STEP_S, SAMPLING, overhead_s=OVERHEAD_S), DEADLINE_S)
    elastic = summarize_sim(simulate(arrivals, 2, DEADLINE_S, STEP_S, SAMPLING, overhead_s=OVERHEAD_S), DEADLINE_S)
    assert fixed["miss_rate"] > 0.25 and fixed["refused"] == fixed["groups"] - fixed["in_time"]
    assert elastic["refused"] <= 0.01 * elastic["groups"], elastic
    # what is still missed: groups that arrive later join the running batch and slow the groups in it
    assert elastic["miss_rate"] <= 0.10, elastic
    assert 2.0 <= elastic["mean_served_count"] < 8.0
