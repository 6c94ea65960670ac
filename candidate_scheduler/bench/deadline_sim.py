"""The deadline policy in simulated time: the real engine (core/engine.py) against a simulated worker.

Two workers, to tell the causes of a miss apart:

- `fluid`: the running batch exactly as the engine's forecast models it (core/forecast.py): every
  running group advances continuously at one step per forward time of ALL the rows running, a joining
  group's fixed cost stalls the worker, a cancelled group leaves at once. What misses here is the
  policy's doing (refusal at receipt, earliest deadline first, the elastic count rule) with a forecast
  that is right about the worker -- though not about the groups that have not arrived yet.
- `stepping`: an idealised running batch, as worker/running.py runs one: assignments join at the next
  step boundary (their conditioning first), every step is one forward over all running rows that takes
  the profiled time for that many rows, a group leaves after its last step, a cancelled one at the next
  boundary. No noise at all -- so what misses here and not under `fluid` comes from the steps being
  discrete (a join waits for a boundary).

The service's own misses beyond `stepping` are the cost model's errors and the machine's noise. Both
workers report `prediction_ratio` as the service does (actual / predicted time of each assignment, the
prediction made when it was sent), and the engine gets `tick` every `tick_s`, as the shell calls it.
"""

from __future__ import annotations

import heapq
import itertools
import time

import numpy as np

from candidate_scheduler.bench.deadline_engine import engine_with_worker
from candidate_scheduler.core.messages import CancelRows, Reply, SendWork, SliceOutcome, WorkerResult
from candidate_scheduler.core.request import Submission
from candidate_scheduler.core.work import SamplingSpec

WORKERS = ("fluid", "stepping")


def _line(step_s: dict[int, float]) -> tuple[float, float]:
    """t(rows) = a + b * rows through the profiled step times (one point: through the origin)."""
    pts = sorted(step_s.items())
    if len(pts) == 1:
        return 0.0, pts[0][1] / pts[0][0]
    (r0, t0), (r1, t1) = pts[0], pts[-1]
    b = (t1 - t0) / (r1 - r0)
    return max(0.0, t0 - b * r0), max(0.0, b)


class _Sim:
    def __init__(self, step_s, sampling, overhead_s, steps):
        self.engine = engine_with_worker(step_s, sampling, heartbeat_timeout_s=1e12)
        self.seq = itertools.count()
        self.events: list = []
        self.sent: dict[int, SendWork] = {}
        self.sent_at: dict[int, float] = {}
        self.cancelled: dict[int, set] = {}
        self.ratios: list[float] = []
        self.event_s: list[float] = []  # wall time of each engine call: the scheduler loop's decision work
        self.overhead_s = overhead_s
        self.steps = steps
        spec = SamplingSpec(**sampling)
        self.shape = (1, spec.horizon, spec.raw_action_dim)
        self.a, self.b = _line(step_s)

    def push(self, t: float, kind: str, payload) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def result(self, batch_id: int, now: float) -> list:
        """The worker answers an assignment (its cancelled groups as cancelled)."""
        work = self.sent.pop(batch_id)
        gone = self.cancelled.pop(batch_id, set())
        predicted = self.engine.assignments[batch_id].predicted_s if batch_id in self.engine.assignments else 0.0
        if predicted > 0 and not gone:
            self.ratios.append((now - self.sent_at[batch_id]) / predicted)
        outputs = tuple(
            SliceOutcome(sw.dispatch.request_id, "cancelled") if sw.dispatch.request_id in gone else
            SliceOutcome(sw.dispatch.request_id, "ok", sw.dispatch.candidate_ids,
                         np.zeros((len(sw.dispatch.candidate_ids), *self.shape), dtype=np.float32))
            for sw in work.slices)
        report = {"condition_s": self.overhead_s, "transformer_forwards": self.steps}
        return self.timed(self.engine.worker_result, work.identity, WorkerResult("w1", batch_id, outputs, report), now)

    def timed(self, call, *args):
        t0 = time.perf_counter()
        out = call(*args)
        self.event_s.append(time.perf_counter() - t0)
        return out


class _Fluid(_Sim):
    def __init__(self, *args):
        super().__init__(*args)
        self.running: dict[int, list] = {}  # batch id -> [rows, steps left]
        self.stall = 0.0
        self.last = 0.0
        self.version = 0

    def _step_s(self) -> float:
        return self.a + self.b * sum(r for r, _left in self.running.values())

    def _advance(self, now: float) -> None:
        dt, self.last = max(0.0, now - self.last), max(self.last, now)
        if not self.running:
            self.stall = max(0.0, self.stall - dt)
            return
        stalled = min(self.stall, dt)
        self.stall -= stalled
        progress = (dt - stalled) / self._step_s()
        for state in self.running.values():
            state[1] -= progress

    def _reschedule(self, now: float) -> None:
        self.version += 1
        if self.running:
            left = min(max(0.0, s[1]) for s in self.running.values())
            self.push(now + self.stall + left * self._step_s(), "check", self.version)

    def send(self, m: SendWork, now: float) -> None:
        self._advance(now)
        rows = sum(len(sw.dispatch.candidate_ids) for sw in m.slices)
        self.running[m.batch_id] = [rows, float(self.steps)]
        self.stall += self.overhead_s
        self._reschedule(now)

    def cancel(self, m: CancelRows, now: float) -> None:
        self.push(now, "check", None)  # it leaves at once

    def worker_event(self, kind: str, payload, now: float) -> list:
        if payload is not None and payload != self.version:
            return []  # a check made stale by a later join or leave
        self._advance(now)
        out = []
        for bid in list(self.running):
            if self.running[bid][1] <= 1e-9 or bid in self.cancelled:
                del self.running[bid]
                out += self.result(bid, now)
        self._reschedule(now)
        return out


class _Stepping(_Sim):
    def __init__(self, *args):
        super().__init__(*args)
        self.running: dict[int, list] = {}  # batch id -> [rows, steps left]
        self.joining: list[int] = []
        self.stepping = False

    def send(self, m: SendWork, now: float) -> None:
        self.joining.append(m.batch_id)
        if not self.stepping:
            self.stepping = True
            self.push(now, "boundary", None)

    def cancel(self, m: CancelRows, now: float) -> None:
        pass  # applied at the next boundary

    def worker_event(self, kind: str, payload, now: float) -> list:
        out = []
        # a step boundary: groups done or cancelled leave and are answered, the waiting ones join
        for bid in list(self.running):
            steps_left = self.running[bid][1]
            if steps_left <= 0 or bid in self.cancelled:
                del self.running[bid]
                out += self.result(bid, now)
        t = now
        for bid in self.joining:
            if bid in self.sent and bid not in self.cancelled:
                rows = sum(len(sw.dispatch.candidate_ids) for sw in self.sent[bid].slices)
                self.running[bid] = [rows, self.steps]
                t += self.overhead_s  # its conditioning runs on the compute thread, before the step
            elif bid in self.sent:
                out += self.result(bid, now)
        self.joining = []
        if not self.running:
            self.stepping = False
            return out
        rows = sum(r for r, _left in self.running.values())
        t += self.a + self.b * rows
        for state in self.running.values():
            state[1] -= 1
        self.push(t, "boundary", None)
        return out


def simulate(arrivals: list[float], min_count: int, deadline_s: float, step_s: dict[int, float], sampling: dict,
             overhead_s: float = 0.0, count: int = 8, tick_s: float = 0.05, worker: str = "fluid",
             deadlines: tuple[float, ...] | None = None) -> dict:
    """`deadlines`: the groups' deadlines taken in turn by arrival (default every one `deadline_s`).
    {"outcomes": one {"status", "error_code", "served_count", "latency_s"} per arrival,
    "prediction_ratios": actual / predicted time of each answered assignment, "engine_event_s": the
    wall time of every engine call (submit, tick, a worker's result), measured in this process}."""
    if worker not in WORKERS:
        raise ValueError(f"worker must be one of {WORKERS}")
    deadlines = tuple(deadlines or (deadline_s,))
    sim = (_Fluid if worker == "fluid" else _Stepping)(step_s, sampling, overhead_s, sampling["steps"])
    image = np.zeros((sampling["height"], sampling["width"], 3), dtype=np.uint8)
    outcomes: list[dict | None] = [None] * len(arrivals)
    for i, t in enumerate(arrivals):
        sim.push(t, "submit", i)

    def handle(out: list, now: float) -> None:
        for m in out:
            if isinstance(m, SendWork):
                sim.sent[m.batch_id], sim.sent_at[m.batch_id] = m, now
                sim.send(m, now)
            elif isinstance(m, CancelRows) and m.batch_id in sim.sent:
                sim.cancelled.setdefault(m.batch_id, set()).update(m.request_ids)
                sim.cancel(m, now)
            elif isinstance(m, Reply):
                i = int(m.result.request_id)
                outcomes[i] = {"status": m.result.status, "error_code": m.result.error_code,
                               "served_count": m.result.served_count, "latency_s": now - arrivals[i]}

    next_tick = 0.0
    while sim.events:
        t, _, kind, payload = heapq.heappop(sim.events)
        while next_tick <= t:
            handle(sim.timed(sim.engine.tick, next_tick), next_tick)
            next_tick += tick_s
        if kind == "submit":
            sub = Submission(str(payload), image, "pick", {"count": count, "reducer": "mean", "min_count": min_count},
                             payload, dict(sampling), deadline_s=deadlines[payload % len(deadlines)])
            handle(sim.timed(sim.engine.submit, ("sim", payload), sub, t), t)
        else:
            handle(sim.worker_event(kind, payload, t), t)
    for _ in range(int(max(deadlines) / tick_s) + 2):  # expiries of whatever is left
        handle(sim.engine.tick(next_tick), next_tick)
        next_tick += tick_s
    done = [o if o is not None else {"status": "no_reply", "error_code": None, "served_count": None,
                                     "latency_s": None} for o in outcomes]
    return {"outcomes": done, "prediction_ratios": sim.ratios, "engine_event_s": sim.event_s}


def summarize_sim(run: dict, deadline_s: float) -> dict:
    outcomes = run["outcomes"]
    n = len(outcomes)
    in_time = sum(1 for o in outcomes if o["status"] == "done" and o["latency_s"] <= deadline_s + 1e-9)
    refused = sum(1 for o in outcomes if o["error_code"] == "deadline_unmeetable")
    expired = sum(1 for o in outcomes if o["status"] == "expired")
    late = sum(1 for o in outcomes if o["status"] == "done" and o["latency_s"] > deadline_s + 1e-9)
    served = [o["served_count"] for o in outcomes if o["status"] == "done" and o["served_count"] is not None]
    ratios = run["prediction_ratios"]
    return {"groups": n, "in_time": in_time, "miss_rate": (n - in_time) / n if n else None, "refused": refused,
            "expired": expired, "done_late": late, "other": n - in_time - refused - expired - late,
            "mean_served_count": float(np.mean(served)) if served else None,
            "prediction_ratio_p50": float(np.median(ratios)) if ratios else None,
            "prediction_ratio_p90": float(np.percentile(ratios, 90)) if ratios else None,
            "engine_event_ms": _ms_stats(run.get("engine_event_s") or [])}


def _ms_stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    arr = np.asarray(values) * 1000.0
    return {"n": int(arr.size), "p50_ms": float(np.median(arr)), "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max())}
