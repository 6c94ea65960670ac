"""The load benchmark's plan: the arms, the shapes and their windows, the load points, and the arrival
schedules (open-loop Poisson arrivals of groups, counts mixed uniformly over 1, 2, 4, 8).

Every arm at every load sees the same sequence of groups (count, seeds, observation) for a shape:
one fixed RNG draws the sequence and unit-rate exponential gaps once; a load point at rate r takes
its first n groups and divides the gaps by r. So arms and loads differ only in timing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# `step_inline` (step batching with every join conditioned on the worker's compute thread, as before the
# conditioning thread) runs only when asked for: it is the before arm of that change
ARMS = ("sglang_sequential", "dispatch", "step", "step_inline")
DEFAULT_ARMS = ("sglang_sequential", "dispatch", "step")
SERVICE_ARMS = ("dispatch", "step", "step_inline")
# The service arms' default `serve` flags; --arm-flags ARM=FLAGS overrides them.
DEFAULT_ARM_FLAGS = {"dispatch": ("--batching", "dispatch"), "step": ("--batching", "step"),
                     "step_inline": ("--batching", "step")}
WORKER_FLAGS = {"step_inline": ("--conditioning", "inline")}  # the service arms' extra `worker` flags
COUNTS = (1, 2, 4, 8)
STEPS = 20
LOAD_SEED = 20240613
SLO_FACTOR = 3.0  # a group is "good" when answered done within 3x the arm's unloaded latency
COMPARE_AT = 0.7  # every arm also runs at 0.7x the dispatch arm's capacity (the targets compare there)
WORKER_CAPACITY = 16  # rows of the service arms' one worker (two groups of 8 can share a batch)
SEQUENCE_LENGTH = 4096


@dataclass(frozen=True)
class ShapePlan:
    """One shape's points and windows. A load point sends groups for `window_s` seconds of arrivals,
    stretched to at least `min_groups` groups at low rates but never past `max_window_s`."""

    side: int
    sweep: tuple[float, ...]  # fractions of each arm's own capacity
    search_probes: int  # capacity search: at most this many load points per arm
    search_step: float  # its geometric step until it brackets the capacity
    window_s: float
    search_window_s: float
    min_groups: int
    max_window_s: float
    unloaded_repeats: int  # one-at-a-time groups per count
    # 0: every group brings a new observation (a robot's next frame). N: observations come from a pool
    # of N that every arm has encoded at warm-up (see FULL: a 256x256 bf16 VAE encode is seconds on CPU).
    observation_pool: int = 0
    # The comparison point (where the p99 target compares the arms) runs this many times longer, with
    # this many times more groups, than a sweep point: a p99 of ~30 groups is their maximum.
    compare_scale: float = 1.0

    def compare_plan(self) -> ShapePlan:
        f = self.compare_scale
        return replace(self, window_s=self.window_s * f, max_window_s=self.max_window_s * f,
                       min_groups=max(1, round(self.min_groups * f)))

    @property
    def name(self) -> str:
        return f"{self.side}x{self.side}"


@dataclass(frozen=True)
class LoadPlan:
    shapes: tuple[ShapePlan, ...]
    search_resolution: float  # stop refining once the failing / passing rates ratio is below this
    parity_groups: int  # replies per arm and shape checked bitwise against sglang's pipeline
    smoke: bool = False


# Sized for the load part of `make bench` to take about 7 minutes on 2 shared CPU cores with three arms
# (measured at 7fe4a06: start 44 s, 64x64 261 s, 256x256 199 s, with a 0.3x sweep point at both shapes,
# which `make bench`'s 15 minutes no longer hold: the search's probes span the low loads). At 64x64 the
# comparison point is 4x a sweep point (about 60 groups an arm). At 256x256 a new observation's bf16 VAE
# encode takes 3.6-4 s on these CPUs (no AVX-512: the fp32 encode is 0.1 s), about 7x a 20-step N=1
# denoise in every arm alike, so there the observations come from a pool of 2 encoded at warm-up and
# the shape measures batching, not the encoder. Its groups take 0.5-5 s, so its few short windows give
# rough figures: `--load-scale` lengthens every window for a careful run.
FULL = LoadPlan(
    shapes=(ShapePlan(64, sweep=(1.2,), search_probes=4, search_step=1.6, window_s=5.0,
                      search_window_s=4.0, min_groups=10, max_window_s=10.0, unloaded_repeats=3,
                      compare_scale=4.0),
            ShapePlan(256, sweep=(1.2,), search_probes=3, search_step=2.0, window_s=6.0,
                      search_window_s=6.0, min_groups=5, max_window_s=8.0, unloaded_repeats=1,
                      observation_pool=2)),
    search_resolution=1.25, parity_groups=2,
)
SMOKE = LoadPlan(
    shapes=(ShapePlan(64, sweep=(0.5, 1.2), search_probes=2, search_step=1.6, window_s=2.5, search_window_s=2.5,
                      min_groups=4, max_window_s=6.0, unloaded_repeats=1),),
    search_resolution=1.25, parity_groups=2, smoke=True,
)


@dataclass(frozen=True)
class GroupSpec:
    """One group of a sequence: its arrival gap at unit rate, count, base seed and place in the sequence
    (which picks its observation, see load_shape.ShapeBench.observation_seed)."""

    gap: float
    count: int
    seed: int
    index: int


def group_sequence(side: int, seed: int = LOAD_SEED, length: int = SEQUENCE_LENGTH) -> list[GroupSpec]:
    gen = np.random.default_rng([seed, side])
    gaps = gen.exponential(1.0, length)
    counts = gen.choice(np.asarray(COUNTS), length)
    seeds = gen.integers(0, 2**31 - 1, length)
    return [GroupSpec(float(g), int(c), int(s), i) for i, (g, c, s) in enumerate(zip(gaps, counts, seeds))]


def arrivals(sequence: list[GroupSpec], rate: float, window_s: float, min_groups: int,
             max_window_s: float) -> list[tuple[float, GroupSpec]]:
    """The first groups of `sequence` at `rate` groups/s: (arrival offset in s, group) for
    max(min_groups, rate * window_s) groups, cut at max_window_s (at least one group)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    wanted = max(min_groups, int(np.ceil(rate * window_s)))
    out = []
    at = 0.0
    for spec in sequence[:wanted]:
        at += spec.gap / rate
        if out and at > max_window_s:
            break
        out.append((at, spec))
    return out


def unloaded_groups(side: int, repeats: int, seed: int = LOAD_SEED) -> list[GroupSpec]:
    """The one-at-a-time groups: every count `repeats` times, interleaved, with their own seeds."""
    gen = np.random.default_rng([seed, side, 1])
    return [GroupSpec(0.0, count, int(gen.integers(0, 2**31 - 1)), r * len(COUNTS) + k)
            for r in range(repeats) for k, count in enumerate(COUNTS)]


def scaled(plan: LoadPlan, factor: float) -> LoadPlan:
    """Every window and group minimum times `factor` (a longer, steadier run)."""
    if factor <= 0:
        raise SystemExit(f"--load-scale must be positive, got {factor}")
    if factor == 1:
        return plan
    return replace(plan, shapes=tuple(
        replace(s, window_s=s.window_s * factor, search_window_s=s.search_window_s * factor,
                max_window_s=s.max_window_s * factor, min_groups=max(1, round(s.min_groups * factor)))
        for s in plan.shapes))


def parse_arm_flags(items: list[str]) -> dict[str, tuple[str, ...]]:
    """['step=--batching step', 'dispatch='] -> {arm: flags}; unknown arms are a usage error."""
    flags = dict(DEFAULT_ARM_FLAGS)
    for item in items:
        arm, sep, value = item.partition("=")
        if not sep or arm not in SERVICE_ARMS:
            raise SystemExit(f"--arm-flags {item!r}: expected ARM=FLAGS with ARM one of {list(SERVICE_ARMS)}")
        flags[arm] = tuple(value.split())
    return flags
