"""Where a fleet run's utilisation goes, from the workers' own account of their steps.

Every worker reports each denoise step it ran (its rows and its seconds) with its heartbeats, and the
scheduler counts them in `forward_rows` and `forward_seconds` (service/metrics.py). Read around a
window, they split the fleet benchmark's utilisation into three factors whose product it is:

- `fullness`: candidate rows per step over the workers' capacity -- how full the scheduler kept the
  batches;
- `step_accuracy`: the declared step time over the measured one -- whether a null worker's step (a
  sleep) took as long as it declares; below 1 when it wakes late, as a thread does that waits for a
  core;
- `stepping`: the workers' step seconds over K x the wall time -- how much of the window the workers
  were stepping, rather than waiting for work, answering or starting it.

    utilisation = rows x steps x step time / capacity / K / wall = fullness x step_accuracy x stepping

when every candidate row of the window stepped once per step (`accounted`, 1.0 when the heartbeats of the
window all arrived). No figure here is a target; the product says which factor a shortfall is in.
"""

from __future__ import annotations

import time

from candidate_scheduler.bench.scrape import PREFIX, scrape

ROWS, SECONDS = PREFIX + "forward_rows", PREFIX + "forward_seconds"


def steps_read(url: str | None) -> dict[str, float]:
    """The step counters of one scrape: steps, candidate rows summed over them, and their seconds."""
    series = scrape(url)
    return {
        "steps": series.get(ROWS + "_count", 0.0),
        "row_steps": series.get(ROWS + "_sum", 0.0),
        # one series per rows label: forward_seconds_sum{rows="8"}
        "seconds": sum(v for k, v in series.items() if k.startswith(SECONDS + "_sum")),
    }


def wait_for_steps(url: str | None, before: dict[str, float], row_steps: float, timeout_s: float = 3.0) -> dict:
    """Scrape until the window's candidate rows x steps reach `row_steps` (the workers send their step
    records with heartbeats, up to an interval after the last step) or `timeout_s` passes; the last scrape."""
    if not url:  # no metrics to wait for
        return steps_read(url)
    give_up = time.monotonic() + timeout_s
    while True:
        after = steps_read(url)
        if after["row_steps"] - before["row_steps"] >= row_steps or time.monotonic() >= give_up:
            return after
        time.sleep(0.1)


def decompose(before: dict[str, float], after: dict[str, float], *, row_steps: float, capacity: int,
              step_s: float, workers: int, wall_s: float) -> dict:
    """The window's factors (see the module docstring); `row_steps`: the candidates answered x their steps,
    what the utilisation's numerator counts."""
    steps = after["steps"] - before["steps"]
    rows = after["row_steps"] - before["row_steps"]
    seconds = after["seconds"] - before["seconds"]
    if steps <= 0 or seconds <= 0 or wall_s <= 0:
        return {"steps": int(steps)}
    return {
        "steps": int(steps),
        "mean_step_ms": seconds / steps * 1e3,
        "fullness": rows / (steps * capacity),
        "step_accuracy": steps * step_s / seconds,
        "stepping": seconds / (workers * wall_s),
        "accounted": rows / row_steps if row_steps else None,
    }
