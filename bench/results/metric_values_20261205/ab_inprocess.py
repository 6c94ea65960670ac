# Ad hoc (2026-12-05): one point of the in-process engine with SchedulerMetrics recording, for the checkout at argv[1].
# python ab_inprocess.py ROOT step|dispatch 1  -> one-candidate groups/s (32 fake workers, 1,000 queued)
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from prometheus_client import CollectorRegistry
from candidate_scheduler.bench import fleet_engine as fe
from candidate_scheduler.core.engine import Engine
from candidate_scheduler.service.metrics import SchedulerMetrics
from candidate_scheduler.gc_tuning import tune_gc
tune_gc()
def run(mode, with_metrics, n=3000):
    fleet = fe.FakeFleet(mode, 32, 8)
    if with_metrics:
        fleet.engine.metrics = SchedulerMetrics(registry=CollectorRegistry())
    fleet.submit(1000 + 256)
    for _ in range(200):
        b = fleet.answered; fleet.answer_oldest(); fleet.submit(fleet.answered - b)
    t0 = time.perf_counter(); a0 = fleet.answered
    for _ in range(n):
        b = fleet.answered; fleet.answer_oldest(); fleet.submit(fleet.answered - b)
    return (fleet.answered - a0) / (time.perf_counter() - t0)
mode = sys.argv[2]
r = run(mode, sys.argv[3] == "1", 600 if mode == "dispatch" else 3000)
print(r)
