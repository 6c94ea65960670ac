"""Predicted cost of work on each worker, calibrated online from what the workers measure.

Per worker and per forward label (SamplingSpec.forward_label: shape, horizon, CFG):

- a forward: t(rows) = a + b * rows, an exponentially weighted least-squares line over the (rows,
  seconds) of every forward the worker reports (in its heartbeats), seeded by the warm-up profile it
  sends when it registers -- so the first prediction is a measurement, never a constant. A label not
  seen yet on a worker borrows the line of the nearest label it has, scaled by the ratio of video
  tokens (height x width x frames, twice under CFG), until forwards of its own arrive. A worker keeps
  its `MAX_LABELS` most recently observed labels, and what no forward or fixed cost can be (a time
  over a day, over a million rows, a label longer than any SamplingSpec makes) is not observed at all.
- a group's fixed cost outside the forwards (conditioning + postprocess), an exponentially weighted
  mean per group, seeded by the fixed cost the warm-up measures at each profiled shape (a fresh
  observation's), then from the reports that come back with every result.
- peak memory: bytes(rows) = m0 + m1 * rows from the peaks reported (CUDA; 0 elsewhere), which caps the
  rows a worker may hold under its memory budget.

The error of every assignment's prediction (actual / predicted, observed when its result arrives) is
kept too, per worker, and `margin(worker_id)` -- a high percentile of that worker's over the recent past
(`margin_quantile`, 0.9 by default), never below 1 (core/margins.py) -- is what the deadline forecasts
multiply that worker's durations by (`Scaled`): on a machine whose steps run 20% slower than measured
one time in ten, a deadline is planned with that 20% in hand. It is measured, not set; the quantile
only says how much of the measured tail to plan for (a higher one misses fewer deadlines and serves
fewer candidates, or refuses more groups). A new margin is a change of its worker's answers
(`changes`), so the fleet's sums mend that worker's terms (core/fleet_terms.py).
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass, field

from candidate_scheduler.core.change_log import ChangeLog
from candidate_scheduler.core.margins import MIN_ERRORS, ErrorWindow, check_margin_quantile

DECAY = 0.97  # per observation: about the last 30 forwards carry the fit
# Labels come from the workers (heartbeats, profiles) and, through the shapes clients ask for (every fps
# is a label of its own), from the clients: a worker keeps its most recently observed labels only, so
# neither can grow the model (nor the time a borrowed line takes to find) without bound. A label used
# now is observed with every forward of it and stays; the warm-up profile sends at most 64.
MAX_LABELS = 256
# A forward label is four ints of at most 64 bits and a suffix (SamplingSpec.forward_label): under 100
# characters. Anything longer is no label the scheduler asks about.
MAX_LABEL_CHARS = 128
# No forward and no group's fixed cost takes a day: a longer "measurement" is a broken worker's, and a
# finite one near 1e308 overflows the fit's sums, whose line turns NaN and predicts 0 s from then on
MAX_OBSERVED_S = 86400.0
# No clock times a transformer forward under a microsecond: a shorter positive one is taken as that.
# The fleet's rate sums rows / forward_s over the workers, mending it by subtracting a worker's old
# rate (core/fleet_terms.py): one worker at 1e-300 s (a rate of 1e301) and then at its true time took
# every other worker's rate with it -- the fleet's rate became 0 and the pipe divided by it. A 0 s
# forward stays 0 (an infinite rate, which those sums count apart).
MIN_FORWARD_S = 1e-6
# Nor does one forward carry a million rows: a line fitted through such a point predicts next to
# nothing for a real batch (and the same rate of 1e20)
MAX_FORWARD_ROWS = 1 << 20
# 20 digits hold any 64-bit size: a label with more (a broken worker's) names no shape to scale by
_LABEL = re.compile(r"^(\d{1,20})x(\d{1,20})h(\d{1,20})(?!\d)")


@dataclass
class LinearFit:
    """Weighted least squares y = a + b x with exponential forgetting; O(1) per observation."""

    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, x: float, y: float, weight: float = 1.0) -> None:
        self.w, self.sx, self.sy = DECAY * self.w + weight, DECAY * self.sx + weight * x, DECAY * self.sy + weight * y
        self.sxx, self.sxy = DECAY * self.sxx + weight * x * x, DECAY * self.sxy + weight * x * y

    @property
    def known(self) -> bool:
        return self.w > 0

    def line(self) -> tuple[float, float]:
        """(a, b); with one distinct x the line goes through the origin (time proportional to rows)."""
        if self.w <= 0:
            return 0.0, 0.0
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        if var <= 1e-9 * max(1.0, mx * mx):
            return 0.0, (my / mx if mx > 0 else 0.0)
        b = (self.sxy / self.w - mx * my) / var
        a = my - b * mx
        if b < 0:  # noise on a flat curve: never predict cheaper for more rows
            return my, 0.0
        return max(a, 0.0), b

    def predict(self, x: float) -> float:
        a, b = self.line()
        return max(0.0, a + b * x)


@dataclass
class Ewma:
    value: float = 0.0
    n: int = 0

    def observe(self, x: float, alpha: float = 0.2) -> None:
        self.value = x if self.n == 0 else (1 - alpha) * self.value + alpha * x
        self.n += 1


def video_tokens(label: str) -> float:
    """The label's video tokens a forward runs per row (height x width x latent frames, twice under CFG);
    1.0 for a label that names no positive size: a borrowed line is scaled by a ratio of these, so a
    zero would divide by zero."""
    m = _LABEL.match(label)
    if not m:
        return 1.0
    h, w, horizon = (int(g) for g in m.groups())
    tokens = (h / 16) * (w / 16) * (horizon // 4 + 1)
    if not 0 < tokens < math.inf:
        return 1.0
    # CFG runs every row twice ([uncond; cond], worker/cosmos3_step.py) and the worker reports the group's
    # rows: the warm-up profiles no CFG shape, and a CFG group borrowing its shape's line was forecast at
    # half its cost until the worker had run one
    return 2 * tokens if label.endswith("+cfg") else tokens


@dataclass
class WorkerCost:
    forward: dict[str, LinearFit] = field(default_factory=dict)
    overhead: dict[str, Ewma] = field(default_factory=dict)
    memory: LinearFit = field(default_factory=LinearFit)
    # Every label of `forward` and `overhead`, least recently observed first (MAX_LABELS)
    recent: collections.OrderedDict[str, None] = field(default_factory=collections.OrderedDict)
    errors: ErrorWindow | None = None  # its assignments' actual / predicted (CostModel._w sets it)

    def touch(self, label: str) -> None:
        """`label` was just observed: it is kept, and the label observed longest ago goes when over the bound."""
        self.recent[label] = None
        self.recent.move_to_end(label)
        while len(self.recent) > MAX_LABELS:
            old, _ = self.recent.popitem(last=False)
            self.forward.pop(old, None)
            self.overhead.pop(old, None)

    def forward_s(self, label: str, rows: int) -> float:
        fit = self.forward.get(label)
        if fit is not None and fit.known:
            return fit.predict(rows)
        known = [k for k, f in self.forward.items() if f.known]
        if not known:
            return 0.0
        nearest = min(known, key=lambda k: abs(video_tokens(k) - video_tokens(label)))
        return self.forward[nearest].predict(rows) * video_tokens(label) / video_tokens(nearest)

    def overhead_s(self, label: str) -> float:
        own = self.overhead.get(label)
        if own is not None and own.n:
            return own.value
        known = [k for k, e in self.overhead.items() if e.n]
        if not known:
            return 0.0
        nearest = min(known, key=lambda k: abs(video_tokens(k) - video_tokens(label)))
        return self.overhead[nearest].value * video_tokens(label) / video_tokens(nearest)

    def max_rows_for(self, budget_bytes: int, capacity: int) -> int:
        """Rows whose predicted peak memory fits the budget (capacity when nothing is known)."""
        if budget_bytes <= 0 or not self.memory.known:
            return capacity
        a, b = self.memory.line()
        if b <= 0:
            return capacity if a <= budget_bytes else 1
        return max(1, min(capacity, int((budget_bytes - a) // b)))


def _label_ok(label: object) -> bool:
    return isinstance(label, str) and 0 < len(label) <= MAX_LABEL_CHARS


class CostModel:
    def __init__(self, margin_quantile: float = 0.9) -> None:
        self.margin_quantile = check_margin_quantile(margin_quantile)
        self.workers: dict[str, WorkerCost] = {}
        self.errors = ErrorWindow(self.margin_quantile)  # the fleet's, over every worker's: a new worker's margin
        # The workers with too few errors of their own, which plan with the fleet's margin: when that moves,
        # their answers change too
        self._young: set[str] = set()
        # Answers since the last observation: forecasts ask the same few questions many times over.
        self._memo: dict[tuple, float] = {}
        self._planned: dict[tuple, float] = {}  # the same, times the worker's margin (`Scaled`)
        # The workers whose answers changed, in order: what others keep from it follows this (`version`)
        self.changes: ChangeLog[str] = ChangeLog()

    @property
    def version(self) -> int:
        """Moves whenever an answer may change: what others cache from the model is keyed by it."""
        return self.changes.stamp

    def observe_error(self, worker_id: str, predicted_s: float, actual_s: float) -> bool:
        """One assignment of this worker took `actual_s` against `predicted_s`; whether a margin moved (the
        fleet's or the worker's)."""
        w = self.workers.get(worker_id)  # one the model has forgotten (it left) has no margin to keep
        before = None if w is None else self.margin(worker_id)
        fleet_moved = self.errors.observe(predicted_s, actual_s)
        if w is not None:
            w.errors.observe(predicted_s, actual_s)
            if len(w.errors) >= MIN_ERRORS:
                self._young.discard(worker_id)  # from now on, its own margin
        if fleet_moved:
            for young in sorted(self._young):  # sorted: the change log reads the same from run to run
                self._changed(young)
        moved = w is not None and self.margin(worker_id) != before
        if moved:
            self._changed(worker_id)
        return moved or fleet_moved

    def largest_margin(self) -> float:
        """The largest margin any worker plans with (1.0 with none): O(workers), asked when one moved."""
        return max((self.margin(wid) for wid in self.workers), default=1.0)

    def _changed(self, worker_id: str) -> None:
        self._memo.clear()
        self._planned.clear()  # a margin changes only with its worker's answers: _changed for them
        self.changes.append(worker_id)

    def margin(self, worker_id: str | None = None) -> float:
        """The `margin_quantile` percentile of actual / predicted over this worker's recent assignments, at
        least 1 (core/margins.py); the fleet's, over every worker's, for None or a worker with too few."""
        w = None if worker_id is None else self.workers.get(worker_id)
        if w is None or worker_id in self._young:
            return self.errors.margin
        return w.errors.margin

    def with_margin(self) -> Scaled:
        return Scaled(self)

    def _w(self, worker_id: str) -> WorkerCost:
        w = self.workers.get(worker_id)
        if w is None:
            w = self.workers[worker_id] = WorkerCost(errors=ErrorWindow(self.margin_quantile))
            self._young.add(worker_id)
        return w

    def forget(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)
        self._young.discard(worker_id)
        self._changed(worker_id)

    def observe_forward(self, worker_id: str, label: str, rows: int, seconds: float) -> None:
        if 0 < rows <= MAX_FORWARD_ROWS and 0 <= seconds <= MAX_OBSERVED_S and _label_ok(label):
            w = self._w(worker_id)
            w.forward.setdefault(label, LinearFit()).observe(rows, max(seconds, MIN_FORWARD_S) if seconds else 0.0)
            w.touch(label)
            self._changed(worker_id)

    def observe_fixed(self, worker_id: str, label: str, seconds: float) -> None:
        """A group's fixed cost at this label, measured apart from any result (the warm-up profile)."""
        if 0 <= seconds <= MAX_OBSERVED_S and _label_ok(label):
            w = self._w(worker_id)
            w.overhead.setdefault(label, Ewma()).observe(seconds)
            w.touch(label)
            self._changed(worker_id)

    def observe_group(self, worker_id: str, label: str, report: dict) -> None:
        """One finished assignment's report: its fixed cost per group, its memory peak per row."""
        groups = max(1, int(report.get("groups", 1) or 1))
        fixed = float(report.get("condition_s", 0.0) or 0.0) + float(report.get("postprocess_s", 0.0) or 0.0)
        if 0 < fixed / groups <= MAX_OBSERVED_S and _label_ok(label):
            w = self._w(worker_id)
            w.overhead.setdefault(label, Ewma()).observe(fixed / groups)
            w.touch(label)
            self._changed(worker_id)
        peak, rows = int(report.get("peak_memory_bytes", 0) or 0), int(report.get("rows", 0) or 0)
        if peak > 0 and rows > 0 and report.get("device", "cpu") != "cpu":
            self._w(worker_id).memory.observe(rows, peak)

    def forward_s(self, worker_id: str, label: str, rows: int) -> float:
        key = (worker_id, label, rows)
        value = self._memo.get(key)
        if value is None:
            w = self.workers.get(worker_id)
            value = self._memo[key] = 0.0 if w is None else w.forward_s(label, rows)
        return value

    def overhead_s(self, worker_id: str, label: str) -> float:
        """A group's fixed cost on this worker (conditioning, postprocess), whatever its rows."""
        key = (worker_id, label)
        value = self._memo.get(key)
        if value is None:
            w = self.workers.get(worker_id)
            value = self._memo[key] = 0.0 if w is None else w.overhead_s(label)
        return value

    def knows(self, worker_id: str, label: str) -> bool:
        """Forwards of this label measured on this worker (not borrowed from another label's line)."""
        w = self.workers.get(worker_id)
        fit = None if w is None else w.forward.get(label)
        return fit is not None and fit.known

    def calibrated(self, worker_id: str) -> bool:
        w = self.workers.get(worker_id)
        return w is not None and any(f.known for f in w.forward.values())


class Scaled:
    """The cost model's durations, each times its worker's margin: what the deadline forecasts plan with."""

    def __init__(self, cost: CostModel):
        self.cost = cost
        self._memo = cost._planned  # kept by the model, which knows when an answer changes

    def forward_s(self, worker_id: str, label: str, rows: int) -> float:
        key = (worker_id, label, rows)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.cost.margin(worker_id) * self.cost.forward_s(worker_id, label, rows)
        return value

    def overhead_s(self, worker_id: str, label: str) -> float:
        key = (worker_id, label)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.cost.margin(worker_id) * self.cost.overhead_s(worker_id, label)
        return value
