"""One root's ZMQ fleet point(s): python zmq_point.py MODE K STEP_S BURST REPS  (PYTHONPATH picks the code)"""
import sys, json, tempfile
from candidate_scheduler.bench import fleet
from candidate_scheduler.service.launcher import Launcher
mode, k, step_s, burst, reps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
size = fleet.FleetSize(k, step_s, burst)
out = []
with Launcher(tempfile.mkdtemp(prefix="ab-")) as launcher:
    h = launcher.scheduler("--batching", mode, "--max-queued-groups", "50000", metrics=True, name="s")
    for _ in range(k):
        launcher.worker(h, "null", fleet.CAPACITY, step_delay=step_s)
    h.wait_workers(k, timeout_s=300)
    for r in range(reps):
        wl = fleet.Workload("burst", (1,), burst)
        res = fleet.run_workload(h, size, wl, f"ab{r}", seed=r)
        out.append({"util": res["utilisation"], "sched_us_per_group": res["cores"]["scheduler"] * res["wall_s"] / burst * 1e6,
                    "all_us_per_group": sum(res["cores"].values()) * res["wall_s"] / burst * 1e6, "check": res["check"]})
print(json.dumps(out))
