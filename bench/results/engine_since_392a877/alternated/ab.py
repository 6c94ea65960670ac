import json, subprocess, sys, os, statistics
HARN = "/work/main/candidate_scheduler/bench/fleet_engine.py"
def point(root, mode, depth=1000, events=None, deadline_every=0):
    events = events or (5000 if mode == "step" else 1500)
    env = dict(os.environ, PYTHONPATH=root, HF_HUB_OFFLINE="1")
    args = {"batching": mode, "depth": depth, "events": events, "warmup": 50, "deadline_every": deadline_every, "counts": [1], "min_count": None}
    out = subprocess.run(["/work/main/.venv/bin/python", HARN, json.dumps(args)], env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
de = int(sys.argv[2]) if len(sys.argv) > 2 else 0
res = {}
for r in range(rounds):
    for mode in ("dispatch", "step"):
        for name, root in (("base", "/tmp/base392"), ("cur", "/work/main")) if r % 2 == 0 else (("cur", "/work/main"), ("base", "/tmp/base392")):
            p = point(root, mode, deadline_every=de)
            res.setdefault((mode, name), []).append(p)
for mode in ("dispatch", "step"):
    b, c = res[(mode, "base")], res[(mode, "cur")]
    gb = [x["groups_per_s"] for x in b]; gc_ = [x["groups_per_s"] for x in c]
    ratios = [y / x for x, y in zip(gb, gc_)]
    print(f"{mode:8s} base {statistics.median(gb):7.0f} {[round(x) for x in gb]}  cur {statistics.median(gc_):7.0f} {[round(x) for x in gc_]}  ratio med {statistics.median(ratios):.3f}  submit us base {statistics.median([x['submit_us'] for x in b]):.1f} cur {statistics.median([x['submit_us'] for x in c]):.1f}  event ms base {statistics.median([x['event_mean_ms'] for x in b]):.3f} cur {statistics.median([x['event_mean_ms'] for x in c]):.3f}")
