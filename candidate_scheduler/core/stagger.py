"""Staggered starts: spread the workers' batch boundaries, so a group that arrives behind a backlog
waits for the next boundary among K workers -- about a batch over K -- rather than a whole batch.

Denoising runs a fixed number of steps, so work started together ends together. A backlog lands on
idle workers (an RL step's rollouts, one tenant's flood) within a few milliseconds, every worker starts,
and since their batches take the same time they stay in step for the whole backlog: each frees its
rows at the same instant, once a batch. Fair queueing puts another tenant's group first, but first is
still up to a batch away: the group waits a batch, then runs its own. Continuous batching in an LLM
server never meets this, because sequences end at different lengths; fixed-step diffusion has to
spread its boundaries on purpose.

So while the backlog is deep, each worker's next start is a decision, made when it is due (idle, or
about to be sent its next work), earliest boundary first. With the others' boundaries around it:
- a boundary that would end within HOLD of a spacing (a batch over K) of another's jumps past the
  run of boundaries crowded ahead of it, to the earliest delay a full spacing (SPREAD) from every
  other -- so a cluster of K workers spreads over the whole batch in one round;
- a busy worker's boundary that sits nearer the one behind it than the one ahead moves to the middle
  of the two, when that moves it at least BALANCE of a spacing -- so spacings even out, and a spread
  fleet, whose drift is a fraction of that, is left alone;
- otherwise it starts at its boundary (now, when idle).
A worker never waits a whole batch. The cost is about half a batch of idle time per worker, once per
backlog, and only when the backlog is at least DEEP_WAVES batches of the whole fleet. Spacings of a few
milliseconds are not spread: the scheduler's own timing (a late wake-up, a burst of messages) moves
boundaries by as much, so the caller staggers only where the spacing is at least MIN_SPACING_S plus
the margin a worker has shown its work needs to arrive in time (core/prefetch.py).

A mixed fleet, whose workers take more than MIXED_FLEET times as long as one another for a batch, is
not staggered: its boundaries drift apart by themselves, and one period would space none of them.

Dispatch batching only. Under step batching a worker's rows free as their groups end, and a group
arriving joins at the next step boundary with a free row; holding a whole worker back for its phase
there showed no gain within the noise (the robot's p99 over its unloaded latency in the fairness
benchmark, four runs each at 60d5641: 2.24-2.42x with it, 2.00-2.78x without), so it is not done. That
was before a step worker's predicted ends were re-anchored as its rows free (core/worker_link.py); it
has not been measured again since.

Phases are delays on a circle of one batch (`period_s`): a phase p says "a batch started p seconds
from the worker's boundary would end together with another worker's". Pure: core/snapshot.py supplies
the phases and applies the delay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

DEEP_WAVES = 8  # queued rows, in batches of the whole fleet, from which starts are staggered
HOLD = 0.25  # of a spacing: a boundary this close to another's is a collision
SPREAD = 0.9  # of a spacing: how far from every other a colliding boundary is moved
BALANCE = 0.35  # of a spacing: the least move that evens out the gaps on either side of a boundary
MIN_SPACING_S = 0.005  # spacings below this are within the scheduler's own timing jitter
MIXED_FLEET = 1.25  # workers' batch periods further apart than this: a mixed fleet, not staggered


def deep(queued_rows: int, fleet_rows: int) -> bool:
    """Whether a backlog is deep enough to pay for staggered starts."""
    return fleet_rows > 0 and queued_rows >= DEEP_WAVES * fleet_rows


def mixed(periods_s: Sequence[float]) -> bool:
    """Whether the workers' batch periods are too far apart for one period to space their boundaries."""
    return max(periods_s) > MIXED_FLEET * min(periods_s)


def delay(period_s: float, workers: int, taken: Sequence[float], balance: bool = True) -> float:
    """The delay before a worker starts its next batch, from its boundary (phase 0). `taken`: the other
    workers' phases relative to it, sorted, each in [0, period_s) (a sequence or a numpy array).
    `balance`: whether its boundary is a real one -- an idle worker's is only now, and a later pass would
    chase a middle that moves with it, so an idle worker only steers clear of collisions."""
    if period_s <= 0 or workers < 2 or len(taken) == 0:
        return 0.0
    spacing = period_s / workers
    ahead, behind = float(taken[0]), period_s - float(taken[-1])  # the gaps to the next boundary and the last
    if min(ahead, behind) < HOLD * spacing:
        return _jump(period_s, spacing, np.asarray(taken, dtype=float))
    middle = (ahead - behind) / 2
    return middle if balance and middle >= BALANCE * spacing else 0.0


def _jump(period: float, spacing: float, taken: np.ndarray) -> float:
    """Past the run of boundaries crowded ahead, to the earliest delay SPREAD from every other; where
    none is within reach, the delay within reach farthest from them.

    In arrays: when a fleet's boundaries start together, each worker that jumps walks past every one
    spread before it, and in Python that made the first round of a 512-worker fleet cost milliseconds
    a decision. The arithmetic is the same, element by element, as one value at a time."""
    hold = HOLD * spacing
    # The run: each boundary within a spacing plus HOLD of the one before it (the first, of phase 0)
    # extends the reach to a spacing past it; the first that is not ends the run (they are sorted)
    reach_before = np.maximum(spacing, np.concatenate(([-math.inf], taken[:-1])) + spacing)
    outside = np.flatnonzero(taken >= reach_before + hold)
    run = int(outside[0]) if len(outside) else len(taken)
    reach = max(spacing, float(taken[run - 1]) + spacing) if run else spacing
    cap = min(period - spacing, reach)
    candidates = np.concatenate(([cap], (taken + spacing) % period, (taken[:-1] + taken[1:]) / 2))
    within = np.unique(candidates[(candidates > 0.0) & (candidates <= cap)])  # sorted, each once
    if not len(within):
        return 0.0
    # how far each is from the nearest taken phase, around the circle: the ones either side of it
    at = np.searchsorted(taken, within, side="left")
    distance = np.minimum(_around(period, within - taken[at % len(taken)]),
                          _around(period, within - taken[at - 1]))
    spread = np.flatnonzero(distance >= SPREAD * spacing)
    if len(spread):
        return float(within[spread[0]])
    return float(within[np.argmax(distance)])  # the farthest; the earliest of those (they are sorted)


def _around(period: float, gap: np.ndarray) -> np.ndarray:
    """The distance of a gap around the circle, either way."""
    gap = np.abs(gap)
    return np.minimum(gap, period - gap)
