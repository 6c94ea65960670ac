"""`candidate-scheduler bench --smoke` keeps working: it starts its own scheduler and workers, runs the
four methods on the tiny checkpoint, and writes JSON, a markdown report and PNG plots.

Numbers are not asserted (a shared CI machine is too noisy for targets); parity is, because it is
exact: the worker's batched group and the scheduler path must equal sglang's own sequential pipeline
bitwise on CPU.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("a_sequential", "b_sglang_batch", "c_worker_batch", "d_scheduler_e2e")
SMOKE_NS = ("1", "8")


def _bench_command() -> list[str]:
    script = Path(sys.executable).with_name("candidate-scheduler")
    if script.exists():
        return [str(script), "bench"]
    found = shutil.which("candidate-scheduler")
    return [found, "bench"] if found else [sys.executable, "-m", "candidate_scheduler.cli", "bench"]


@pytest.mark.timeout(180)
def test_bench_smoke_writes_results_with_exact_parity(tmp_path, model_dir):
    out = tmp_path / "results"
    env = dict(os.environ, HF_HUB_OFFLINE="1", SGLANG_DISABLE_COSMOS3_GUARDRAILS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [*_bench_command(), "--smoke", "--model", str(model_dir), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170,
    )
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    result = json.loads((out / "bench_cpu_smoke.json").read_text())
    assert result["meta"]["smoke"] is True
    small = result["shapes"]["small"]
    assert set(small["methods"]) == set(METHODS)
    for method in METHODS:
        per_n = small["methods"][method]
        assert set(per_n) == set(SMOKE_NS), (method, sorted(per_n))
        for n in SMOKE_NS:
            row = per_n[n]
            assert row["median_ms"] > 0 and row["p90_ms"] >= row["median_ms"]
            assert row["forwards"] is not None and row["forwards"] > 0
            assert row["memory"]["peak_bytes"] > 0
    for n in SMOKE_NS:
        # ours equal sglang's own sequential pipeline bitwise (CPU); (a) is deterministic
        assert small["methods"]["a_sequential"][n]["parity_max_abs_diff_vs_a"] == 0.0
        assert small["methods"]["c_worker_batch"][n]["parity_max_abs_diff_vs_a"] == 0.0
        assert small["methods"]["d_scheduler_e2e"][n]["parity_max_abs_diff_vs_a"] == 0.0
        # sglang's image-list batch: reported (its candidates match no seed once N > 1)
        b = small["methods"]["b_sglang_batch"][n]["parity_max_abs_diff_vs_a"]
        assert isinstance(b, float) and math.isfinite(b)
        # one physical forward per step for a batched group; N per step for the sequential reference
        steps = small["sampling"]["steps"]
        assert small["methods"]["c_worker_batch"][n]["forwards"] == steps
        assert small["methods"]["a_sequential"][n]["forwards"] == steps * int(n)
    assert result["null_worker"]["all_done"] is True
    assert result["null_worker"]["admitted_groups_per_s"] > 0
    assert {t["target"] for t in result["targets"]}  # the targets table is there (PASS/MISS not asserted)

    for png in ("latency_small.png", "speedup_small.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, png
    report = (out / "report.md").read_text()
    assert "| target | measured | result |" in report
    assert "latency_small.png" in report
