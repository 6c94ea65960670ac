"""The method benchmark's grid: the four methods, the shapes, the candidate counts and repeats, the
seeds and the null-worker run's sizes."""

from __future__ import annotations

METHODS = ("a_sequential", "b_sglang_batch", "c_worker_batch", "d_scheduler_e2e")
LABELS = {
    "a_sequential": "(a) sequential sglang",
    "b_sglang_batch": "(b) sglang image-list batch",
    "c_worker_batch": "(c) worker batched group",
    "d_scheduler_e2e": "(d) scheduler end to end",
}
SHORT = {m: m[0] for m in METHODS}
SHAPES = {
    "small": {"height": 64, "width": 64, "steps": 4},
    "large": {"height": 256, "width": 256, "steps": 10},
}
NS_FULL = (1, 2, 4, 8, 10)
NS_SMOKE = (1, 8)
# Repeats of the full run: with the load, deadline and fleet benchmarks after it, `make bench` must stay
# under 15 minutes on 2 CPU cores (40 small repeats made it 15 min 38 s on 2026-12-01; with the fleet
# benchmark and 30 repeats it took 17 min on 2026-12-02, the method part 146 s of it).
REPEATS_FULL = {"small": 20, "large": 15}
BASE_SEED = 20240607
REDUCER = "mean"
NULL_GROUPS = 1000
NULL_COUNT = 8
NULL_CAPACITY = 8
WORKER_CAPACITY = 16
TARGET_N = 8
