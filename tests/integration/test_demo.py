"""`make run` is `candidate-scheduler demo`: the first thing a user sees must work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ENV, ROOT, free_port

pytestmark = pytest.mark.sglang


def test_demo_starts_everything_and_answers_one_group(model_dir):
    ports = [str(free_port()) for _ in range(5)]
    cmd = [sys.executable, "-m", "candidate_scheduler.cli", "demo", "--once", "--model", str(model_dir),
           "--request-port", ports[0], "--control-port", ports[1], "--worker-port", ports[2],
           "--compat-port", ports[3], "--metrics-port", ports[4]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "status=done" in out.stdout
    assert "candidates: 8 x [16, 7]" in out.stdout
    assert f"metrics: http://127.0.0.1:{ports[4]}/metrics" in out.stdout
