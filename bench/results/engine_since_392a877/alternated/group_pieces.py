import time, numpy as np, sys
from candidate_scheduler.bench.fleet_engine import FakeFleet
from candidate_scheduler.core.request import validate
from candidate_scheduler.core.group import Group
from candidate_scheduler.core.messages import SliceOutcome
from candidate_scheduler.gc_tuning import tune_gc
tune_gc()
f = FakeFleet("dispatch", 4, 8)
e = f.engine
acts = np.zeros((1, 1, 16, 7), np.float32)
N = 2000
pc = time.perf_counter
KEYS = ("validate", "Group", "admit", "start", "fold", "finish", "result", "end_misc")
best = {k: 1e9 for k in KEYS}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    subs = [f.submission() for _ in range(N)]
    T = {k: 0.0 for k in KEYS}
    for sub in subs:
        t0 = pc(); req = validate(sub); t1 = pc()
        g = Group(req, None, 0.0, e.clock); t2 = pc()
        e.groups[g.request_id] = g
        e.admit(g); t3 = pc()
        d = g.start_slice(0, "w0"); e.pending.discard(g.request_id, 0); e.unstarted.discard(g.request_id); t4 = pc()
        g.fold(0, "w0", SliceOutcome(g.request_id, "ok", (0,), acts)); t5 = pc()
        g.finish(); t6 = pc()
        r = g.take_reply(); res = g.result(r); t7 = pc()
        e._forget(g); e.replies.put(g.request_id, (), None, res); t8 = pc()
        for k, a, b in (("validate", t0, t1), ("Group", t1, t2), ("admit", t2, t3), ("start", t3, t4), ("fold", t4, t5), ("finish", t5, t6), ("result", t6, t7), ("end_misc", t7, t8)):
            T[k] += b - a
    for k in KEYS: best[k] = min(best[k], T[k] / N * 1e6)
print(" ".join(f"{k} {v:5.2f}" for k, v in best.items()), f"sum {sum(best.values()):.1f}")
