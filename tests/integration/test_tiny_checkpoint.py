"""The tiny Cosmos3 checkpoint is written locally, deterministically, and sglang's loader takes it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ENV, ROOT


def _write(path) -> None:
    subprocess.run([sys.executable, "-m", "candidate_scheduler.cli", "make-checkpoint", str(path)],
                   check=True, capture_output=True, env=ENV, cwd=ROOT, timeout=300)


def test_same_command_twice_gives_byte_identical_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a)
    _write(b)
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b and len(files_a) >= 8
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    meta = json.loads((a / "tiny_checkpoint.json").read_text())
    assert meta["raw_action_dim"] == 7 and len(meta["weights_sha256"]) == 64
    index = json.loads((a / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"


@pytest.mark.sglang
def test_sglang_loader_builds_cosmos3_pipeline_and_runs_a_policy_request(model_dir, sglang_reference):
    import numpy as np

    from candidate_scheduler.service.client import synthetic_image
    from candidate_scheduler.core.work import SamplingSpec

    image = synthetic_image(64, 64, seed=1)
    actions = sglang_reference(image, "open the drawer", SamplingSpec(), 5)
    assert actions.shape == (16, 7) and actions.dtype == np.float32 and np.all(np.isfinite(actions))
    # denormalisation with the checkpoint's action stats is applied: dims have different ranges
    stats = json.loads((model_dir / "action_stats.json").read_text())["global"]
    assert stats["q99"][6] > stats["q99"][0]
    again = sglang_reference(image, "open the drawer", SamplingSpec(), 5)
    assert again.tobytes() == actions.tobytes()
    assert sglang_reference(image, "open the drawer", SamplingSpec(), 6).tobytes() != actions.tobytes()
