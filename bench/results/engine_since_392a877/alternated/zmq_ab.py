import json, subprocess, os, statistics, sys
def run(root, *args):
    env = dict(os.environ, PYTHONPATH=root, HF_HUB_OFFLINE="1")
    out = subprocess.run(["/work/main/.venv/bin/python", "/tmp/prof/zmq_point.py", *map(str, args)], env=env, cwd=root, capture_output=True, text=True, timeout=900)
    if out.returncode: print(out.stderr[-2000:]); raise SystemExit(1)
    return json.loads(out.stdout.strip().splitlines()[-1])
cfgs = [("dispatch", 16, 0.01, 4000), ("step", 32, 0.02, 8000)]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
res = {}
for r in range(rounds):
    for cfg in cfgs:
        order = (("base", "/tmp/base392"), ("cur", "/work/main")) if r % 2 == 0 else (("cur", "/work/main"), ("base", "/tmp/base392"))
        for name, root in order:
            pts = run(root, *cfg, 3)
            res.setdefault((cfg, name), []).extend(pts)
            print(cfg[:2], name, [(round(p["util"], 3), round(p["sched_us_per_group"]), p["check"].get("ok", p["check"]) if isinstance(p["check"], dict) else p["check"]) for p in pts], flush=True)
for cfg in cfgs:
    for name in ("base", "cur"):
        pts = res[(cfg, name)]
        print(cfg[:2], name, "util med", round(statistics.median(p["util"] for p in pts), 3), "sched us/group med", round(statistics.median(p["sched_us_per_group"] for p in pts)), "all us/group", round(statistics.median(p["all_us_per_group"] for p in pts)))
