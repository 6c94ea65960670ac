"""`python -m candidate_scheduler.bench --load --smoke` keeps working: it starts its arms (sglang's own
pipeline one candidate per request, and `serve` + a cosmos3 worker per batching mode), measures each
arm's unloaded latency and capacity, sweeps a few open-loop Poisson loads, and writes the JSON, the
markdown report and the p99 plot.

Numbers are not asserted (a shared CI machine is too noisy); the structure is, and so is parity: the
replies of every arm, taken under load, equal sglang's own pipeline for their seeds bitwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from candidate_scheduler.service.launcher import child_env

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {"offered_groups_per_s", "p50_s", "p99_s", "goodput_groups_per_s", "first_step_p50_s", "rows_per_forward",
            "shape", "phase", "fraction_of_capacity", "groups_sent", "statuses"}


@pytest.mark.timeout(420)
def test_load_bench_smoke_writes_results_with_exact_parity(tmp_path, model_dir):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "candidate_scheduler.bench", "--load", "--smoke", "--model", str(model_dir),
         "--out", str(out)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, f"load bench failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    result = json.loads((out / "load_cpu_smoke.json").read_text())
    assert result["meta"]["smoke"] is True
    arms = result["meta"]["arms"]
    assert {"sglang_sequential", "dispatch"} <= set(arms), (arms, result["meta"]["notes"])
    assert set(result["arms"]) == set(arms) and set(result["capacity_groups_per_s"]) == set(arms)
    for arm in arms:
        assert result["capacity_groups_per_s"][arm] > 0
        rows = result["arms"][arm]
        assert len(rows) >= 3, (arm, rows)  # search probes + sweep points (+ the comparison point)
        for row in rows:
            assert ROW_KEYS <= set(row), (arm, sorted(ROW_KEYS - set(row)))
            assert row["shape"] == "64x64"
            assert row["groups_sent"] >= 1 and row["p99_s"] >= row["p50_s"] > 0
            assert 0 <= row["goodput_groups_per_s"] <= row["offered_groups_per_s"] * (1 + 1e-9)
        assert any(r["phase"].startswith("sweep") for r in rows), (arm, [r["phase"] for r in rows])
        # every group sent answered done, but those a point cancelled once its verdict was known
        for r in rows:
            cancelled = r["statuses"].get("cancelled", 0)
            assert r["statuses"].get("done", 0) + cancelled == r["groups_sent"], (arm, r["statuses"])
            assert cancelled <= r["cancelled_at_verdict"] and (r["stopped_early"] or not cancelled), (arm, r)
    shape = result["shapes"]["64x64"]
    for arm in arms:
        unloaded = shape["unloaded"][arm]
        assert set(unloaded["per_count_median_s"]) == {"1", "2", "4", "8"}
        assert unloaded["slo_s"] == pytest.approx(3 * unloaded["unloaded_s"])
        parity = shape["parity"][arm]
        assert parity["groups"] >= 1 and parity["all_bitwise_equal"] is True, (arm, parity)
    assert "dispatch" in shape["compare"]  # every arm ran at 0.7x the dispatch capacity
    assert {t["target"] for t in result["targets"]}  # the targets are there (PASS/MISS not asserted)

    png = (out / "load_p99.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    report = (out / "load_report.md").read_text()
    assert "| shape | target | measured | result |" in report and "load_p99.png" in report
    assert set(shape["capacity_consistent_groups_per_s"]) == set(arms)

    # the outputs rebuilt from the JSON alone (python -m candidate_scheduler.bench.load_report) agree
    from candidate_scheduler.bench.load_report import rebuild

    again = json.loads(rebuild(out / "load_cpu_smoke.json", plots=False)["json"].read_text())
    assert again["targets"] == result["targets"] and again["arms"] == result["arms"]
    assert again["shapes"]["64x64"]["capacity_consistent_groups_per_s"] == shape["capacity_consistent_groups_per_s"]
