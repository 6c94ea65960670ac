"""The deadline benchmark's settings: the shape, the two arms, the deadline rule, the loads and the
windows, for the full run (<= 4 minutes on 2 CPUs) and the CI smoke run (about a minute)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

COUNT = 8
WORKER_CAPACITY = 8
ARMS = {"fixed": {"count": COUNT, "min_count": COUNT}, "elastic": {"count": COUNT, "min_count": 2}}
DEADLINE_FACTOR = 3.0  # every group's deadline: this many unloaded latencies of a count-8 group
SAMPLING = {"height": 64, "width": 64, "steps": 10, "horizon": 16}
REDUCER = "mean"
BASE_SEED = 20240614
TARGET_FACTOR = 1.5  # the load of the targets, in capacities


@dataclass(frozen=True)
class DeadlineSettings:
    smoke: bool
    seeds: tuple[int, ...]  # the seed streams: group k of a window uses seeds[k % len(seeds)]
    unloaded_rounds: int  # count-8 groups per seed run alone (the unloaded latency, and the references)
    warmup_groups: int  # count-8 groups before anything is measured (caches, the cost model)
    capacity_iterations: int
    probe_window_s: float
    # offered loads, in fixed-arm capacities; the full run had 0.75 and 1.25 too, which `make bench`'s
    # 15 minutes no longer hold (each costs 2 arms x a window and a drain). The smoke run's 8x must
    # overload the worker whatever its two short probes measured, so that its elastic arm is served
    # fewer than 8 candidates: two bisection steps put the capacity in [mu/4, 3mu/4], so 8x is at
    # least 2 mu, twice what one worker can serve (4x was not: a CI run whose first probe saw one
    # miss measured mu/4, offered exactly mu, and every elastic group was served 8)
    factors: tuple[float, ...]
    window_s: float  # the arrival window of each (arm, load)
    target_window_s: float  # ... of the target load (longer: the targets are read there)
    sim_window_s: float = 60.0  # simulated seconds per (arm, load) in simulated time (bench/deadline_sim.py)
    drain_extra_s: float = 5.0  # after the last send: the deadline plus this for the last replies
    sampling: dict = field(default_factory=lambda: dict(SAMPLING))

    def window_of(self, factor: float) -> float:
        return self.target_window_s if factor == TARGET_FACTOR else self.window_s

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "count": COUNT, "worker_capacity": WORKER_CAPACITY, "arms": ARMS,
                "deadline_factor": DEADLINE_FACTOR, "reducer": REDUCER, "target_factor": TARGET_FACTOR,
                "batching": "step"}


def full() -> DeadlineSettings:
    return DeadlineSettings(
        smoke=False, seeds=tuple(BASE_SEED + i for i in range(4)), unloaded_rounds=2, warmup_groups=3,
        capacity_iterations=4, probe_window_s=7.0, factors=(0.5, 1.0, 1.5, 2.0),
        window_s=8.0, target_window_s=16.0,
    )


def smoke() -> DeadlineSettings:
    return DeadlineSettings(
        smoke=True, seeds=(BASE_SEED, BASE_SEED + 1), unloaded_rounds=2, warmup_groups=1,
        capacity_iterations=2, probe_window_s=4.0, factors=(1.5, 8.0), window_s=4.0, target_window_s=4.0,
        sim_window_s=20.0, drain_extra_s=3.0,
    )
