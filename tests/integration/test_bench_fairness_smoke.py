"""`python -m candidate_scheduler.bench --fairness --smoke` keeps working: a keyed scheduler and four null
workers per arm, one tenant's flood and another's group every 100 ms, with and without fair queueing,
under both batching modes; it writes the JSON, the report and the plot.

Numbers are not asserted (a shared CI machine is too noisy; tests/unit/test_access.py pins the order
fair queueing gives). Completeness and parity are: every group of both tenants was answered `done`,
and every action is the null model's answer for its seeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from candidate_scheduler.bench.fairness import DEFAULT_ARMS
from candidate_scheduler.service.launcher import child_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_fairness_bench_smoke_answers_both_tenants_correctly(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "candidate_scheduler.bench", "--fairness", "--smoke", "--out", str(out)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"fairness bench failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    folder = out / "fairness_smoke"
    result = json.loads((folder / "fairness.json").read_text())
    assert result["meta"]["smoke"] is True
    assert [a["arm"] for a in result["arms"]] == [name for name, _flags in DEFAULT_ARMS]
    for a in result["arms"]:
        answered = a["statuses"]
        assert set(answered) == {"done"}, (a["arm"], answered)
        assert answered["done"] == result["flood"] + a["robot_unloaded_ms"]["n"] + a["robot_sent"], a["arm"]
        assert a["wrong_results"] == 0, a["arm"]
        assert a["robot_under_flood_ms"]["n"] > 0 and a["flood_groups_per_s"] > 0
    report = (folder / "fairness.md").read_text()
    assert "robot under flood" in report and (folder / "fairness.png").stat().st_size > 0
