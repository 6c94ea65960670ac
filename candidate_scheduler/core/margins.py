"""The forecast margin: how much longer than predicted work has recently run, kept per worker.

Each assignment's error (actual / predicted wall time, observed when its result arrives) goes into its
worker's window and into the fleet's. A worker's margin -- the `quantile` of its window's errors, never
below 1 -- is what deadline forecasts multiply that worker's durations by (core/cost_model.Scaled). A
worker with fewer than `MIN_ERRORS` of its own (one that just joined) plans with the fleet's margin.

Per worker, because the fleet's workers are not alike: a slower GPU, a busier host, or a worker whose
warm-up profile claims ten times its speed runs late on every assignment, and with one pooled window the
0.9 quantile was that worker's error -- every other worker's forecasts were multiplied by it, and
deadlines the honest workers could keep were refused at receipt.
"""

from __future__ import annotations

import bisect
import collections
import math

ERRORS_KEPT = 200  # recent prediction errors behind a margin
MIN_ERRORS = 5  # fewer than this: no margin of one's own yet; the 0.9 quantile of 5 is the second largest
STEP = 0.01  # a margin follows its quantile in moves of more than 1%


def check_margin_quantile(q: float) -> float:
    """`q` if it is a valid margin quantile, in [0.5, 1]; ValueError otherwise (the one place the range is)."""
    if not 0.5 <= q <= 1.0:
        raise ValueError(f"margin_quantile must be in [0.5, 1], got {q!r}")
    return q


class ErrorWindow:
    """The last `ERRORS_KEPT` errors, also kept sorted, and the margin they give (`margin`).

    The margin moves only when the quantile has moved by more than `STEP` of it: every move re-plans the
    worker's share of the fleet's forecasts (its terms in core/fleet_terms.py, the cost model's answers),
    and a quantile over noisy errors moves by a hair at almost every result."""

    def __init__(self, quantile: float) -> None:
        self.quantile = check_margin_quantile(quantile)
        self.errors: collections.deque[float] = collections.deque(maxlen=ERRORS_KEPT)
        self._ranked: list[float] = []
        self.margin = 1.0  # the `quantile` of the errors kept, at least 1; 1.0 with fewer than MIN_ERRORS

    def __len__(self) -> int:
        return len(self.errors)

    def observe(self, predicted_s: float, actual_s: float) -> bool:
        """Keep actual / predicted (nothing when that is no finite error); whether the margin moved."""
        if not (0 < predicted_s < math.inf and 0 <= actual_s < math.inf):  # inf / inf: a NaN no ranking places
            return False
        if len(self.errors) == self.errors.maxlen:
            del self._ranked[bisect.bisect_left(self._ranked, self.errors[0])]
        ratio = actual_s / predicted_s
        self.errors.append(ratio)
        bisect.insort(self._ranked, ratio)
        ranked = self._ranked
        quantile = 1.0 if len(ranked) < MIN_ERRORS else max(1.0, ranked[int(self.quantile * (len(ranked) - 1))])
        if abs(quantile - self.margin) <= STEP * self.margin:
            return False
        self.margin = quantile
        return True
