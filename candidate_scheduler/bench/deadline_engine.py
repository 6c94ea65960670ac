"""The deadline decisions' own cost, in process: the part of "a refusal leaves the scheduler within 5 ms
of receipt" that the client-side round trip cannot separate from sockets and scheduling noise.

An engine (core/engine.py, no sockets) with one 8-row worker whose cost model has the service's measured
step times holds a queue of `depth` elastic count-8 groups (one running, the rest waiting). Timed:

- refuse: `Engine.submit` of a count-8 group whose deadline cannot be met -- validation and the
  forecast at receipt (core/deadlines.refuse_at_receipt), i.e. the scheduler's whole decision;
- tick: one `Engine.tick` with that queue -- planning, which reconsiders the elastic counts of the
  groups at the head (one forecast each at least). The scheduler's loop is busy this long whenever it
  plans (every tick, heartbeat and result), and a refusal that arrives meanwhile waits for it.
"""

from __future__ import annotations

import time

import numpy as np

from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.messages import Registration, Reply
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.spec import ModelCapability
from candidate_scheduler.core.work import SamplingSpec

DEPTHS = (1, 4, 16, 64)


def _submission(rid: str, image: np.ndarray, sampling: dict, min_count: int, deadline_s: float) -> Submission:
    return Submission(rid, image, "pick", {"count": 8, "reducer": "mean", "min_count": min_count}, 1, dict(sampling),
                      deadline_s=deadline_s)


def engine_with_worker(step_s: dict[int, float], sampling: dict, **config) -> Engine:
    """A step-batching engine with one registered 8-row worker "w1" whose warm-up profile is `step_s`
    ({rows: seconds of one denoise step}). No prefetch unless asked: the simulated workers of
    deadline_sim.py run whatever they are sent at once, as a worker does that is sent only what fits."""
    config.setdefault("prefetch", 0)
    engine = Engine(EngineConfig(batching="step", max_queued_groups=100_000, **config))
    label = SamplingSpec(**sampling).forward_label()
    capability = ModelCapability("cosmos3", reducers=("mean",), max_candidates_per_batch=8,
                                 max_candidates_per_group=256).to_dict()
    profile = tuple((label, rows, seconds) for rows, seconds in sorted(step_s.items()))
    engine.register(b"w1", Registration("w1", capability, 8, profile=profile), 0.0)
    return engine


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e6)


def _at_depth(step_s: dict[int, float], sampling: dict, deadline_s: float, depth: int, repeats: int) -> dict:
    image = np.zeros((sampling["height"], sampling["width"], 3), dtype=np.uint8)
    engine = engine_with_worker(step_s, sampling)
    # deadlines far enough out to be admitted: the queue is what the decisions look through
    for k in range(depth):
        engine.submit(("c", k), _submission(f"q{k}", image, sampling, 2, 60.0 + k), 0.001 * k)
    now = 0.001 * depth
    ids = iter(range(10**9))
    refused = []

    def refuse() -> None:
        out = engine.submit(("c", -1), _submission(f"r{next(ids)}", image, sampling, 8, deadline_s / 100), now)
        refused.extend(m.result.error_code for m in out if isinstance(m, Reply))

    refuse_us = _median_us(refuse, repeats)
    tick_us = _median_us(lambda: engine.tick(now), repeats)
    if set(refused) != {"deadline_unmeetable"}:
        raise RuntimeError(f"the engine did not refuse as expected at depth {depth}: {set(refused)}")
    return {"depth": depth, "refuse_us": refuse_us, "tick_us": tick_us}


def engine_timings(step_s: dict[int, float], sampling: dict, deadline_s: float, depths=DEPTHS,
                   repeats: int = 50) -> dict:
    """step_s: {rows: seconds of one denoise step} measured on the service (e.g. {2: .., 8: ..})."""
    rows = [_at_depth(step_s, sampling, deadline_s, depth, repeats) for depth in depths]
    return {"step_s": {str(k): v for k, v in step_s.items()}, "repeats": repeats, "rows": rows}
