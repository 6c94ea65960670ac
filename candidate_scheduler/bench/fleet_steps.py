"""Where a fleet run's utilisation goes, from the workers' own account of their steps.

Every worker reports each transformer forward it ran (its rows and seconds) with its heartbeats, and
the scheduler counts them in `forward_rows` and `forward_seconds` (service/metrics.py). A null worker
runs one forward a step, so for the fleet benchmark's workers these are its steps (a worker that runs a
step as several forwards reports each with the step's rows split among them, and its seconds too).
Read around a window, they split the fleet benchmark's utilisation into three factors whose product
it is:

- `fullness`: candidate rows per step over the workers' capacity -- how full the scheduler kept the
  batches;
- `step_accuracy`: the declared step time over the measured one -- whether a null worker's step (a
  sleep) took as long as it declares; below 1 when it wakes late (waiting for a core, or for the
  interpreter lock its other threads hold);
- `stepping`: the workers' step seconds over K x the wall time -- how much of the window the workers
  were stepping, rather than waiting for work, answering or starting it.

    utilisation = rows x steps x step time / capacity / K / wall = fullness x step_accuracy x stepping

when the rows the workers stepped are the rows of the groups answered `done` (`accounted`: the one over
the other, 1.0 when every step record arrived and no other group stepped; above 1 when groups that
expired or failed had stepped too). No figure here is a target; the product says which factor a
shortfall is in. A step's seconds are the worker's sleep and its model's step, not its answer
(`finish`), the answer's encoding, or its next work's start.
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


def wait_for_steps(url: str | None, before: dict[str, float], row_steps: float, *, settle: bool = False,
                   timeout_s: float = 10.0, settle_s: float = 0.7) -> dict:
    """The window's last scrape, once its step records are in: the workers send them with heartbeats, up
    to an interval after their last step. Waits until the window's candidate rows x steps reach
    `row_steps` (every candidate answered `done`, each step recorded); with `settle` -- some group ended
    otherwise, and rows it stepped count too -- also until the counters have not moved for `settle_s`,
    longer than a heartbeat. Gives up after `timeout_s` (`accounted` then shows what is missing)."""
    if not url:  # no metrics to wait for
        return steps_read(url)
    give_up = time.monotonic() + timeout_s
    last, still_since = None, time.monotonic()
    while True:
        after = steps_read(url)
        now = time.monotonic()
        if after != last:
            last, still_since = after, now
        reached = after["row_steps"] - before["row_steps"] >= row_steps
        if reached and (not settle or now - still_since >= settle_s) or now >= give_up:
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
