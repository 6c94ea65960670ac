"""`python -m candidate_scheduler.bench --fleet --smoke` keeps working: the engine in process against queue
depth (both batching modes, with and without deadlines) and against the fleet's size (also under the
defaults, on a simulated clock), then `serve` against 1 and 4 null worker
processes over ZMQ, every workload (with the workers reniced for the diagnostic one, then back); it
writes the JSON, the report and both plots.

Numbers are not asserted (a shared CI machine is too noisy). Completeness and parity are: every group
was answered exactly once, every `done` action is the null model's answer for its seeds, and only a
group with a deadline may be refused (at receipt); the workers' step records account for every candidate
row's steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from candidate_scheduler.bench import fleet as fleet_bench
from candidate_scheduler.service.launcher import child_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_fleet_bench_smoke_answers_every_group_once_and_correctly(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "candidate_scheduler.bench", "--fleet", "--smoke", "--out", str(out)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, f"fleet bench failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    folder = out / "fleet_smoke"
    result = json.loads((folder / "fleet.json").read_text())
    assert result["meta"]["smoke"] is True
    for key in ("engine", "engine_deadlines", "engine_elastic"):
        rows = result[key]
        assert {(r["batching"], r["depth"]) for r in rows} == {(m, d) for m in ("dispatch", "step") for d in (100, 1000)}
        for r in rows:
            assert r["events"] > 0 and r["event_ms"]["median"] > 0 and r["groups_per_s"] > 0
    assert all(r["counts"] == [8] and r["min_count"] == 2 and r["deadline_every"] == 1 for r in result["engine_elastic"])
    sizes = result["engine_sizes"]  # against the fleet's size: deadline groups, 1,000 queued
    assert {(r["batching"], r["workers"]) for r in sizes} == {(m, k) for m in ("dispatch", "step") for k in (32, 128)}
    assert all(r["deadline_every"] == 1 and r["depth"] == 1000 and r["events"] > 0 and r["submit_us"] > 0 for r in sizes)
    # again under the defaults on a simulated clock, the engine's time charged to it: the backlog kept the
    # fleet busy and never ran dry, and starts were staggered under dispatch batching (only)
    defaults = result["engine_defaults"]
    assert {(r["batching"], r["workers"]) for r in defaults} == {(m, k) for m in ("dispatch", "step") for k in (32, 128)}
    for r in defaults:
        assert r["queued_at_end"] > 0 and r["utilisation"] > 0.9 and r["engine_us_per_group"] > 0, r
        assert r["charged"] and r["answered_over_ideal"] > 0.9 and 0 < r["loop_busy"] < 1, r
        assert (r["staggered_starts"] > 0) == (r["batching"] == "dispatch"), r
    # one group of 8 at a time, back to back and spaced apart (spinning), then asleep
    spacing = result["engine_spacing"]
    assert [(r["spacing_ms"], r["wait"]) for r in spacing] == [(0.0, "spin"), (10.0, "spin"), (10.0, "sleep")]
    for r in spacing:
        assert r["groups"] == 30 and 0 < r["submit_us"] and 0 < r["plan_us"] and 0 < r["result_us"], r
    runs = result["fleet"]["runs"]
    assert {(r["workers"], r["batching"]) for r in runs} == {(k, m) for k in (1, 4) for m in ("dispatch", "step")}
    # the diagnostic arm renices the workers and back: as root (CI) it runs; without the right to lower a
    # nice value again it is skipped and says why
    names = {r["workload"]["name"] for r in runs}
    skipped = result["fleet"]["skipped"]
    assert names | {r["workload"]["name"] for r in skipped} == {"burst", "burst_mixed", "poisson", "burst_deadline",
                                                               "burst_elastic", "burst_workers_niced"}
    assert all("renice" in r["skipped"] for r in skipped)
    assert bool(skipped) == (not fleet_bench.can_renice_back())
    for r in runs:
        check = r["check"]
        assert check["replies"] == check["groups"] == r["workload"]["groups"], r["workload"]
        assert check["wrong_results"] == 0, r["workload"]
        allowed = {"done", "rejected"} if r["workload"]["deadline_s"] else {"done"}
        assert set(check["statuses"]) <= allowed and check["statuses"].get("done", 0) > 0, (r["workload"], check)
        if r["workload"]["min_count"] is not None:  # elastic: served n in [min_count, count], checked per reply
            assert 2 <= check["served_mean"] <= 8, check
        assert 0 < r["utilisation"] <= 1.05 and r["groups_per_s"] > 0
        assert r["cores"]["scheduler"] > 0 and r["cores"]["workers"] > 0
        assert set(r["waited"]) == {"scheduler", "workers", "client"} and min(r["waited"].values()) >= 0
        # the workers' own step records: every candidate row's steps arrived, a null step (a sleep) never
        # took less than it declares, and the three factors multiply to the utilisation
        f = r["steps"]
        assert f["accounted"] == pytest.approx(1.0), (r["workload"], f)
        assert 0 < f["fullness"] <= 1 and 0 < f["step_accuracy"] <= 1 and 0 < f["stepping"] <= 1.05, f
        assert f["fullness"] * f["step_accuracy"] * f["stepping"] == pytest.approx(r["utilisation"], rel=1e-6)
    report = (folder / "fleet_report.md").read_text()
    assert "The scheduler over ZMQ" in report and "Where the CPU goes" in report
    assert "Where the utilisation goes" in report and "One group of 8 candidates at a time" in report
    assert "#### Against the fleet's size" in report and "under the scheduler's defaults" in report
    for plot in ("fleet_utilisation.png", "fleet_engine.png", "fleet_engine_sizes.png", "fleet_engine_defaults.png"):
        assert (folder / plot).stat().st_size > 0
