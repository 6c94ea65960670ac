"""The warm-up profile a worker measures before it registers: the scheduler's first cost model.

For each profiled shape, a synthetic group of 1, half-capacity and full-capacity rows joins an empty
running batch and runs a few denoise steps; the median time of a step (after one untimed step) is one
(forward label, rows, seconds) record. The first group of each shape is also timed from its start to
its output, steps excluded: a group's fixed cost at that shape (the conditioning of a fresh observation
and prompt, the action postprocess), recorded as (forward label, 0, seconds) -- rows 0, since it does
not grow with rows; a scheduler that knows no such record skips it, as it skips every record without
rows. The scheduler fits its per-worker cost model to these until the worker's results take over
(core/cost_model.py), so no prediction rests on a constant, nor on another shape's measurement.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from candidate_scheduler.core.work import CandidateWork, GroupWork, SamplingSpec

log = logging.getLogger("candidate_scheduler.worker")

TIMED_STEPS = 3


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"64x64,256x256" -> [(64, 64), (256, 256)]."""
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        h, _, w = item.partition("x")
        shapes.append((int(h), int(w)))
    return shapes


def warm_up(adapter, capacity: int, shapes: list[tuple[int, int]], step_delay_s: float = 0.0) -> list[tuple[str, int, float]]:
    records = []
    for height, width in shapes:
        sampling = SamplingSpec(height=height, width=width, steps=TIMED_STEPS + 2)
        # a fresh observation for every shape (a constant image would be a conditioning-cache hit at the
        # next shape's resize): what a robot's next frame costs
        image = np.random.default_rng(height * 10_007 + width).integers(0, 256, (1, height, width, 3), dtype=np.uint8)
        _untimed_start(adapter, sampling, 255 - image)
        for k, rows in enumerate(sorted({1, max(1, capacity // 2), capacity})):
            item = GroupWork(f"warm-up-{k}", image, [f"warm up at {height}x{width}"], sampling,
                             [CandidateWork(i, seed=i) for i in range(rows)])
            group = None
            try:
                started = time.perf_counter()
                group = adapter.start(item)
                fixed = time.perf_counter() - started
                adapter.step([group])  # untimed: first-call costs (allocator, kernels) stay out
                times = []
                for _ in range(TIMED_STEPS):
                    t0 = time.perf_counter()
                    adapter.step([group])
                    # the worker's test knob makes every step slower, profiled ones too: added, not slept
                    # (3 s steps took 27 s of warm-up), since a sleep measures as what it asks for
                    times.append(time.perf_counter() - t0 + step_delay_s)
                adapter.step([group])  # its last step: it is done
                t0 = time.perf_counter()
                adapter.finish(group)
                fixed += time.perf_counter() - t0
                group = None
            except Exception:  # noqa: BLE001 - a profile that cannot run leaves the model uncalibrated
                log.exception("warm-up profile at %dx%d, %d rows failed", height, width, rows)
                continue
            finally:
                if group is not None:  # a failed step must not keep the group's K/V for the worker's life
                    adapter.release(group)
            records.append((sampling.forward_label(), rows, statistics.median(times)))
            if k == 0:  # the first timed start of the shape: its observation not yet cached
                records.append((sampling.forward_label(), 0, fixed))
    return records


def _untimed_start(adapter, sampling: SamplingSpec, image: np.ndarray) -> None:
    """Start and release a group at the shape with another observation, so that the timed start's fixed
    cost leaves out what only a shape's first start pays (allocator growth, kernel selection, lazy
    initialisation) and the results' running average would take many groups to wash out."""
    group = None
    try:
        group = adapter.start(GroupWork("warm-up-shape", image, ["warm up"], sampling, [CandidateWork(0, seed=0)]))
    except Exception:  # noqa: BLE001 - the timed runs below report a shape that cannot start
        log.debug("untimed warm-up start at %s failed", sampling.forward_label(), exc_info=True)
    finally:
        if group is not None:
            adapter.release(group)
