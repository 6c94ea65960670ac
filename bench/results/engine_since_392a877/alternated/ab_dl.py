import json, subprocess, os, statistics, sys
HARN = "/work/main/candidate_scheduler/bench/fleet_engine.py"
def point(root, mode, depth, events=2000, deadline_every=1):
    env = dict(os.environ, PYTHONPATH=root, HF_HUB_OFFLINE="1")
    args = {"batching": mode, "depth": depth, "events": events, "warmup": 50, "deadline_every": deadline_every, "counts": [1], "min_count": None}
    out = subprocess.run(["/work/main/.venv/bin/python", HARN, json.dumps(args)], env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
mode = sys.argv[1]; rounds = int(sys.argv[2])
res = {}
for r in range(rounds):
    for depth in (100, 10000):
        order = (("base", "/tmp/base392"), ("cur", "/work/main")) if r % 2 == 0 else (("cur", "/work/main"), ("base", "/tmp/base392"))
        for name, root in order:
            p = point(root, mode, depth)
            res.setdefault((name, depth), []).append(p)
            print(name, depth, round(p["groups_per_s"]), round(p["event_mean_ms"], 3), round(p["event_ms"].get("median", -1), 3), round(p["submit_us"]), flush=True)
for name in ("base", "cur"):
    m = {d: statistics.median(x["event_mean_ms"] for x in res[(name, d)]) for d in (100, 10000)}
    g = {d: statistics.median(x["groups_per_s"] for x in res[(name, d)]) for d in (100, 10000)}
    print(name, "event mean med", m, "ratio", round(m[10000] / m[100], 2), "groups/s med", g)
