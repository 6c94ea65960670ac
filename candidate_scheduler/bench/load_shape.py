"""One shape of the load benchmark, for every arm: warm-up, unloaded latency, capacity search, the sweep
around each arm's capacity plus the comparison point, and parity against sglang's pipeline.

Definitions (bench/README.md):
- unloaded latency: groups sent one at a time; per count the median. The arm's `unloaded_s` is the
  largest per-count median (the slowest group of the mix alone, which is what the p99 of the mix
  served one at a time converges to: a quarter of the mix is N=8); `unloaded_mean_s` is the mean of
  the per-count medians (a mix group's expected latency alone).
- SLO: 3x `unloaded_s`. Capacity: the highest offered load (groups/s) whose p99 stays within it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import msgspec
import numpy as np

from candidate_scheduler.bench.common import PROMPT, forecast_errors
from candidate_scheduler.bench.load_arms import Arm, rows_per_forward
from candidate_scheduler.bench.load_plan import (
    COMPARE_AT,
    COUNTS,
    SERVICE_ARMS,
    SLO_FACTOR,
    STEPS,
    LoadPlan,
    ShapePlan,
    arrivals,
    group_sequence,
    unloaded_groups,
)
from candidate_scheduler.bench.load_point import Planned, run_point, summarise
from candidate_scheduler.bench.scrape import PREFIX, scrape

REDUCER = "mean"
# Observation seeds: phase * PHASE_SEEDS + place in the sequence (fresh), or POOL_SEED + pool slot.
PHASE_SEEDS = 1_000_000
WARM_UP, UNLOADED, FIRST_POINT = 1, 2, 10
POOL_SEED = 7_000_000
# A worker reports its forwards with its heartbeats (every 0.5 s by default): a point's window closes once
# they are in (settled_scrape). Counters still for two heartbeat intervals count as in: a cosmos3 step of
# several cohorts records rows // forwards a forward, so the rows x steps it reports may fall short.
SETTLE_S, SETTLE_TIMEOUT_S = 1.0, 5.0
_FORWARD_ROWS = PREFIX + "forward_rows"


def settled_scrape(url: str | None, before: dict[str, float], row_steps: float | None) -> dict[str, float]:
    """The scrape that closes a load point's window. A scrape at its last reply misses the forwards the
    workers ran since their last heartbeat, and the next point would count them: so this waits until the
    window's candidate rows x steps reach `row_steps` (every group sent answered done, each of its steps
    recorded; None: some group ended otherwise, and how far it stepped is unknown), else until the
    counters have not moved for SETTLE_S, giving up after SETTLE_TIMEOUT_S."""
    after = scrape(url)
    if not after:
        return after
    key = _FORWARD_ROWS + "_sum"
    now = time.monotonic()
    give_up, still_since, last = now + SETTLE_TIMEOUT_S, now, after
    while True:
        if row_steps is not None and after.get(key, 0.0) - before.get(key, 0.0) >= row_steps:
            return after
        if now - still_since >= SETTLE_S or now >= give_up:
            return after
        time.sleep(0.05)
        after, now = scrape(url), time.monotonic()
        if after.get(key) != last.get(key) or after.get(_FORWARD_ROWS + "_count") != last.get(_FORWARD_ROWS + "_count"):
            last, still_since = after, now


class ShapeBench:
    def __init__(self, shape: ShapePlan, plan: LoadPlan, arms: dict[str, Arm], reference: Arm, progress,
                 seed: int):
        self.shape = shape
        self.plan = plan
        self.arms = arms
        self.reference = reference
        self.progress = progress
        self.seed = seed
        self.sequence = group_sequence(shape.side, seed)
        self._n = 0
        self.runs: dict[str, list] = {name: [] for name in arms}  # PointRun per arm, for parity

    # ---- requests ------------------------------------------------------------------------------------------
    def observation_seed(self, phase: int, index: int) -> int:
        """Fresh observations: a seed of their own per (phase, place in the sequence), so no load point,
        unloaded run or warm-up replays another's observation (an arm's conditioning caches would turn
        those encodes into hits). Pooled: one of the pool's observations."""
        if self.shape.observation_pool:
            return POOL_SEED + index % self.shape.observation_pool
        return phase * PHASE_SEEDS + index

    def request(self, arm: str, spec, phase: int) -> msgspec.Struct:
        from candidate_scheduler.service.client import make_request, synthetic_image

        self._n += 1
        seed = self.observation_seed(phase, spec.index)
        image = synthetic_image(self.shape.side, self.shape.side, seed=seed)
        return make_request(image, PROMPT, request_id=f"{arm}-{self.shape.side}-{self._n}",
                            count=spec.count, seed=spec.seed, reducer=REDUCER, return_candidates=True,
                            height=self.shape.side, width=self.shape.side, steps=STEPS)

    def _one_at_a_time(self, arm: Arm, specs, phase: int) -> list[tuple[int, float, dict]]:
        from candidate_scheduler.service.client import Client

        out = []
        with Client(arm.endpoint, timeout_s=600) as client:
            for spec in specs:
                req = self.request(arm.name, spec, phase)
                t0 = time.perf_counter()
                result = client.wait(client.send(req))
                latency = time.perf_counter() - t0
                if not result.ok:
                    raise RuntimeError(f"{arm.name}: unloaded group failed: {result.status}: {result.error_code}: "
                                       f"{result.error}")
                out.append((spec.count, latency, result.metrics))
        return out

    # ---- phases -----------------------------------------------------------------------------------------------
    def warm_up(self, arm: Arm) -> None:
        """Untimed: one group per count (the sglang arm is always batch 1: one group of one), then one
        group of one per pooled observation, so every arm holds the pool's encodes."""
        self.progress.set_description(f"{self.shape.name} {arm.name} warm-up")
        counts = (1,) if arm.name == "sglang_sequential" else COUNTS
        specs = [s for s in unloaded_groups(self.shape.side, 1, self.seed + 7) if s.count in counts]
        specs += [replace(s, count=1, index=i) for i, s in
                  enumerate(unloaded_groups(self.shape.side, 1, self.seed + 8)[: self.shape.observation_pool])]
        self._one_at_a_time(arm, specs, WARM_UP)
        self.progress.update(1)

    def unloaded(self, arm: Arm) -> dict:
        self.progress.set_description(f"{self.shape.name} {arm.name} unloaded")
        samples = self._one_at_a_time(arm, unloaded_groups(self.shape.side, self.shape.unloaded_repeats, self.seed),
                                     UNLOADED)
        self.progress.update(1)
        per_count = {str(c): float(np.median([lat for n, lat, _m in samples if n == c])) for c in COUNTS}
        unloaded_s = max(per_count.values())
        first = [m.get("first_step_s") for _n, _lat, m in samples if m.get("first_step_s") is not None]
        return {
            "per_count_median_s": per_count,
            "unloaded_s": unloaded_s,
            "unloaded_mean_s": float(np.mean(list(per_count.values()))),
            "unloaded_p99_s": float(np.percentile([lat for _n, lat, _m in samples], 99)),
            "first_step_median_s": float(np.median(first)) if first else None,
            # one group at a time on an idle worker: how well the cost model predicts each assignment
            "forecast_error": forecast_errors([m for _n, _lat, m in samples]),
            "slo_s": SLO_FACTOR * unloaded_s,
            "samples": [{"count": n, "latency_s": lat} for n, lat, _m in samples],
        }

    def point(self, arm: Arm, rate: float, slo_s: float, phase: str, *, search: bool = False,
              early_stop: bool = False, shape: ShapePlan | None = None) -> dict:
        shape = shape or self.shape
        window = shape.search_window_s if search else shape.window_s
        phase_seed = FIRST_POINT + len(self.runs[arm.name])
        planned = [Planned(at, spec.count, self.request(arm.name, spec, phase_seed))
                   for at, spec in arrivals(self.sequence, rate, window, shape.min_groups, shape.max_window_s)]
        self.progress.set_description(f"{self.shape.name} {arm.name} {phase} {rate:.2f} groups/s ({len(planned)})")
        before = scrape(arm.metrics_url)
        run = run_point(arm.endpoint, rate, planned, slo_s, early_stop=early_stop,
                        drain_timeout_s=max(120.0, 20 * slo_s), cancel=arm.cancel if arm.control else None)
        row = summarise(run, slo_s)
        # Per forward, from the scheduler's histogram, where there is one (the same measure for both
        # service arms); the replies' per-group figure is kept beside it.
        sent = run.sent
        row_steps = STEPS * sum(o.planned.count for o in sent) if all(o.status == "done" for o in sent) else None
        rows, source = rows_per_forward(before, settled_scrape(arm.metrics_url, before, row_steps))
        if rows is not None:
            row["rows_per_forward"], row["rows_per_forward_source"] = rows, source
        row.update(shape=self.shape.name, phase=phase)
        self.runs[arm.name].append((row, run))
        self.progress.update(1)
        return row

    def search(self, arm: Arm, unloaded: dict) -> tuple[float, dict, list[dict]]:
        """Geometric steps from the one-at-a-time service rate until a probe passes and one fails,
        then geometric midpoints, within `search_probes` points. Failing probes stop early."""
        slo = unloaded["slo_s"]
        step = self.shape.search_step
        rate = 1.0 / unloaded["unloaded_mean_s"]
        passed: list[float] = []
        failed: list[float] = []
        rows = []
        for _ in range(self.shape.search_probes):
            row = self.point(arm, rate, slo, "search", search=True, early_stop=True)
            rows.append(row)
            (passed if row["p99_within_slo"] else failed).append(rate)
            if passed and failed:
                lo, hi = max(passed), min([f for f in failed if f > max(passed)] or [max(passed) * step])
                if hi / lo < self.plan.search_resolution:
                    break
                rate = float(np.sqrt(lo * hi))
            elif passed:
                rate *= step
            else:
                rate /= step
        if passed:
            capacity = max(passed)
            bound = "measured" if failed and min(failed) > capacity else "at least (no probe above it failed)"
        else:
            capacity = min(failed) / step
            bound = "below the lowest probe (estimated as the lowest probe / step)"
        return capacity, {"bound": bound, "probes": len(rows)}, rows

    def sweep(self, arm: Arm, capacity: float, slo_s: float, done_rates: list[float]) -> list[dict]:
        rows = []
        for fraction in self.shape.sweep:
            rate = fraction * capacity
            if any(abs(rate / r - 1) < 0.03 for r in done_rates):
                continue
            rows.append(self.point(arm, rate, slo_s, f"sweep {fraction:g}x"))
            done_rates.append(rate)
        return rows

    def compare(self, arm: Arm, rate: float, own_capacity: float, slo_s: float, done_rates: list[float]) -> dict:
        """The point at COMPARE_AT x the dispatch arm's capacity, `compare_scale` times longer than a sweep
        point for the arms the targets compare there (the service arms). The others (sglang_sequential) get
        a sweep point's length, as does an arm far past its own capacity, which may stop early: no target
        reads their p99 there, and near or past its capacity a long window only grows a backlog to drain
        (sglang_sequential's long 64x64 comparison point took 45 s for its 20 s of arrivals)."""
        past = rate > 1.3 * own_capacity
        long = arm.name in SERVICE_ARMS and not past and self.shape.compare_scale != 1
        for row, _run in () if long else self.runs[arm.name]:
            if abs(row["offered_groups_per_s"] / rate - 1) < 0.03 and not row["stopped_early"]:
                row["phase"] += f" = compare {COMPARE_AT:g}x dispatch"
                return row
        row = self.point(arm, rate, slo_s, f"compare {COMPARE_AT:g}x dispatch", early_stop=past,
                         shape=self.shape.compare_plan() if long else None)
        done_rates.append(rate)
        return row

    def parity(self, arm: Arm) -> dict:
        """Up to `parity_groups` done replies of this arm (the busiest sweep point's, largest counts
        first) sent again, alone, to sglang's own pipeline: every candidate must be bitwise equal."""
        self.progress.set_description(f"{self.shape.name} {arm.name} parity")
        pool = sorted(self.runs[arm.name], key=lambda rr: rr[0]["offered_groups_per_s"], reverse=True)
        picked, counts = [], set()
        for _row, run in pool:
            for o in sorted(run.outcomes, key=lambda o: -o.planned.count):
                if o.status == "done" and o.candidates is not None and o.planned.count not in counts:
                    picked.append(o)
                    counts.add(o.planned.count)
                if len(picked) >= self.plan.parity_groups:
                    break
            if len(picked) >= self.plan.parity_groups:
                break
        from candidate_scheduler.service.client import Client

        checks = []
        with Client(self.reference.endpoint, timeout_s=600) as client:
            for o in picked:
                self._n += 1
                again = msgspec.structs.replace(o.planned.request, request_id=f"parity-{arm.name}-{self._n}")
                ref = client.wait(client.send(again))
                if not ref.ok:
                    raise RuntimeError(f"parity reference failed: {ref.status}: {ref.error}")
                got = np.asarray(o.candidates, dtype=np.float32)
                want = np.asarray(ref.candidates, dtype=np.float32)
                same_shape = got.shape == want.shape
                checks.append({
                    "count": o.planned.count, "seed": o.planned.request.seed,
                    "bitwise_equal": bool(same_shape and np.array_equal(got, want)),
                    "max_abs_diff": float(np.max(np.abs(got - want))) if same_shape else None,
                })
        self.progress.update(1)
        return {"groups": len(checks), "all_bitwise_equal": bool(checks) and all(c["bitwise_equal"] for c in checks),
                "checks": checks}

    # ---- the whole shape ---------------------------------------------------------------------------------
    def run(self) -> dict:
        unloaded, capacity, search, points = {}, {}, {}, {name: [] for name in self.arms}
        rates: dict[str, list[float]] = {name: [] for name in self.arms}
        for arm in self.arms.values():
            self.warm_up(arm)
        for arm in self.arms.values():
            unloaded[arm.name] = self.unloaded(arm)
        for arm in self.arms.values():
            cap, info, rows = self.search(arm, unloaded[arm.name])
            capacity[arm.name], search[arm.name] = cap, info
            points[arm.name] += rows
            rates[arm.name] += [r["offered_groups_per_s"] for r in rows if r["p99_within_slo"]]
        for arm in self.arms.values():
            points[arm.name] += self.sweep(arm, capacity[arm.name], unloaded[arm.name]["slo_s"], rates[arm.name])
        compare_rate = COMPARE_AT * capacity["dispatch"] if "dispatch" in capacity else None
        compare = {}
        if compare_rate is not None:
            for arm in self.arms.values():
                row = self.compare(arm, compare_rate, capacity[arm.name], unloaded[arm.name]["slo_s"], rates[arm.name])
                if row not in points[arm.name]:
                    points[arm.name].append(row)
                compare[arm.name] = row
        parity = {arm.name: self.parity(arm) for arm in self.arms.values()}
        for name, rows in points.items():
            for row in rows:
                row["fraction_of_capacity"] = row["offered_groups_per_s"] / capacity[name]
            rows.sort(key=lambda r: r["offered_groups_per_s"])
        return {"shape": self.shape.name, "side": self.shape.side, "steps": STEPS,
                "observation_pool": self.shape.observation_pool, "unloaded": unloaded,
                "capacity_groups_per_s": capacity, "capacity_search": search, "points": points,
                "compare_rate_groups_per_s": compare_rate, "compare": compare, "parity": parity}
