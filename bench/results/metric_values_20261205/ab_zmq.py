# Ad hoc (2026-12-05): serve + K null workers from the checkout at argv[1], bursts of one-candidate groups
# through bench.fleet.run_workload. python ab_zmq.py ROOT MODE K STEP_S BURST N
import sys, tempfile
root = sys.argv[1]
sys.path.insert(0, root)
import candidate_scheduler
assert candidate_scheduler.__file__.startswith(root), candidate_scheduler.__file__
from candidate_scheduler.bench import fleet as F
from candidate_scheduler.service.launcher import Launcher
mode, K, step, burst, n = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
size = F.FleetSize(K, step, burst)
with Launcher(tempfile.mkdtemp()) as L:
    h = L.scheduler("--batching", mode, "--max-queued-groups", "50000", metrics=True, name="s")
    for _ in range(K):
        L.worker(h, "null", F.CAPACITY, step_delay=step)
    h.wait_workers(K, timeout_s=300)
    F.run_workload(h, size, F.Workload("burst", (1,), 1000), "warm", 0)
    for i in range(n):
        r = F.run_workload(h, size, F.Workload("burst", (1,), burst), f"b{i}", i)
        done = r["groups_per_s"] * r["wall_s"]
        print(f"{root} {mode} K={K} util {r['utilisation']:.3f} sched_us_per_group {r['cores']['scheduler'] * r['wall_s'] / done * 1e6:.0f} waited {r['waited']['scheduler']:.2f} ok {r['check']['wrong_results'] == 0 and r['check']['replies'] == burst}", flush=True)
