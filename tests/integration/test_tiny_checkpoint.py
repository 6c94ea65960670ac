"""The Cosmos3 checkpoints are written locally, deterministically, and sglang's loader takes them."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ENV, ROOT

# The default checkpoint's bytes as written before presets existed (every file's path and bytes,
# and the weights alone): a change to them (a new torch RNG, a reordered init, a new config key)
# silently changes every parity figure measured on it.
DEFAULT_CHECKPOINT_SHA256 = "269400af4a2d0ac1d0c064acc5c4f63ff2b59e0e209a703f31025af7d87d6617"
DEFAULT_WEIGHTS_SHA256 = "b82ac6d68b3efff8298a570cb42f174eeb8ce027e427f7061562db454024ee74"
DROID = {"domain_id": 8, "raw_action_dim": 10}  # sglang's EMBODIMENT_TO_DOMAIN_ID / _RAW_ACTION_DIM


def _write(path) -> None:
    subprocess.run([sys.executable, "-m", "candidate_scheduler.cli", "make-checkpoint", str(path)],
                   check=True, capture_output=True, env=ENV, cwd=ROOT, timeout=300)


def _files(root) -> list:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def _tree_digest(root) -> str:
    h = hashlib.sha256()
    for rel in _files(root):
        h.update(rel.as_posix().encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def _run_python(code: str, *args: str, timeout: int = 300) -> dict:
    """Run code in a fresh interpreter (one sglang pipeline per process) and return the JSON it
    prints on its last line."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_same_command_twice_gives_byte_identical_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a)
    _write(b)
    files_a, files_b = _files(a), _files(b)
    assert files_a == files_b and len(files_a) >= 8
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    meta = json.loads((a / "tiny_checkpoint.json").read_text())
    assert meta["raw_action_dim"] == 7 and meta["weights_sha256"] == DEFAULT_WEIGHTS_SHA256
    assert _tree_digest(a) == DEFAULT_CHECKPOINT_SHA256
    index = json.loads((a / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"
    assert len(json.loads((a / "action_stats.json").read_text())["global"]["q01"]) == 7


def test_raw_action_dim_changes_only_the_stats_and_bad_widths_are_refused(tmp_path):
    from candidate_scheduler.worker.tiny_checkpoint import write_checkpoint

    out = write_checkpoint(tmp_path / "droid", raw_action_dim=10)
    meta = json.loads((out / "tiny_checkpoint.json").read_text())
    assert meta["raw_action_dim"] == 10 and meta["weights_sha256"] == DEFAULT_WEIGHTS_SHA256
    stats = json.loads((out / "action_stats.json").read_text())["global"]
    assert {k: len(v) for k, v in stats.items()} == {k: 10 for k in ("q01", "q99", "min", "max", "mean", "std")}
    for bad in (0, 65, 2.5, True):
        with pytest.raises(ValueError, match="raw_action_dim"):
            write_checkpoint(tmp_path / "bad", raw_action_dim=bad)
    with pytest.raises(ValueError, match="unknown checkpoint preset"):
        write_checkpoint(tmp_path / "bad", preset="huge")
    assert not (tmp_path / "bad").exists()


# One sglang process: run a droid request on argv[1] (twice, then once without denormalisation),
# compare two loaded tensors with the files, then run checkpoint_check on the dirs in argv[3].
# check() only builds meta-device modules, so it can share the process with the pipeline.
_SGLANG_RUN = r"""
import glob, json, os, sys
import numpy as np
import torch
from safetensors.torch import load_file
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.client import synthetic_image
from candidate_scheduler.worker.cosmos3 import load_sglang_pipeline, sglang_reference_actions

model_dir, spec, check_dirs = sys.argv[1], SamplingSpec(**json.loads(sys.argv[2])), json.loads(sys.argv[3])
pipeline, server_args = load_sglang_pipeline(model_dir)
image = synthetic_image(64, 64, seed=1)
served = sglang_reference_actions(pipeline, server_args, image, "open the drawer", spec, 5)
again = sglang_reference_actions(pipeline, server_args, image, "open the drawer", spec, 5)
stats_path = server_args.pipeline_config.action_stats_path
server_args.pipeline_config.action_stats_path = None  # the same request, without denormalisation
normalized = sglang_reference_actions(pipeline, server_args, image, "open the drawer", spec, 5)
loaded_equals_files = {}
for component, key in (("vae", "encoder.conv_in.weight"), ("transformer", "proj_in.weight")):
    loaded = pipeline.get_module(component).state_dict()[key]
    for f in sorted(glob.glob(os.path.join(model_dir, component, "*.safetensors"))):
        tensors = load_file(f)
        if key in tensors:  # in the dtype sglang computes in (the tiny preset's VAE file is fp32)
            loaded_equals_files[component] = bool(torch.equal(loaded, tensors[key].to(loaded.dtype)))
from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3_action import (
    EMBODIMENT_TO_DOMAIN_ID, get_raw_action_dim)
droid = {"domain_id": EMBODIMENT_TO_DOMAIN_ID["droid_lerobot"], "raw_action_dim": get_raw_action_dim("droid_lerobot")}
checks = []
if check_dirs:
    from candidate_scheduler.worker.checkpoint_check import check
    checks = [check(d) for d in check_dirs]
print(json.dumps({"shape": list(served.shape), "finite": bool(np.isfinite(served).all()),
                  "repeatable": served.tobytes() == again.tobytes(), "stats_path": stats_path,
                  "served": served.tolist(), "normalized": normalized.tolist(),
                  "loaded_equals_files": loaded_equals_files, "droid_lerobot": droid, "checks": checks},
                 default=str))
"""


def _sglang_run(model_dir, check_dirs=()) -> dict:
    return _run_python(_SGLANG_RUN, str(model_dir), json.dumps(DROID), json.dumps([str(d) for d in check_dirs]))


def _assert_denormalised_with(report: dict, stats: dict) -> None:
    import numpy as np

    served, normalized = np.asarray(report["served"]), np.asarray(report["normalized"])
    q01, q99 = np.asarray(stats["q01"]), np.asarray(stats["q99"])
    # sglang's quantile denormalisation, every one of the 10 dims with its own range
    np.testing.assert_allclose(served, (normalized + 1.0) / 2.0 * (q99 - q01) + q01, rtol=1e-5, atol=1e-5)
    assert not np.allclose(served, normalized)


@pytest.mark.sglang
def test_sglang_pipeline_runs_a_droid_request_on_a_raw_action_dim_10_checkpoint(tmp_path):
    from candidate_scheduler.worker.tiny_checkpoint import write_checkpoint

    out = write_checkpoint(tmp_path / "droid", raw_action_dim=10)
    report = _sglang_run(out)
    assert report["droid_lerobot"] == DROID  # what sglang resolves domain_name="droid_lerobot" to
    assert report["shape"] == [16, 10] and report["finite"] and report["repeatable"]
    assert report["stats_path"] == str((out / "action_stats.json").resolve())
    assert report["loaded_equals_files"] == {"vae": True, "transformer": True}
    _assert_denormalised_with(report, json.loads((out / "action_stats.json").read_text())["global"])


@pytest.mark.sglang
def test_sglang_loader_builds_cosmos3_pipeline_and_runs_a_policy_request(model_dir, sglang_reference):
    import numpy as np

    from candidate_scheduler.core.work import SamplingSpec
    from candidate_scheduler.service.client import synthetic_image

    image = synthetic_image(64, 64, seed=1)
    actions = sglang_reference(image, "open the drawer", SamplingSpec(), 5)
    assert actions.shape == (16, 7) and actions.dtype == np.float32 and np.all(np.isfinite(actions))
    # denormalisation with the checkpoint's action stats is applied: dims have different ranges
    stats = json.loads((model_dir / "action_stats.json").read_text())["global"]
    assert stats["q99"][6] > stats["q99"][0]
    again = sglang_reference(image, "open the drawer", SamplingSpec(), 5)
    assert again.tobytes() == actions.tobytes()
    assert sglang_reference(image, "open the drawer", SamplingSpec(), 6).tobytes() != actions.tobytes()


@pytest.fixture(scope="module")
def full_preset(tmp_path_factory):
    """The full preset written config-only, a copy sglang must reject, and the full preset's
    writer run at the tiny dimensions (twice, with 1 and 4 threads); one sglang process reports
    on all of them."""
    from candidate_scheduler.worker import tiny_checkpoint as tiny
    from candidate_scheduler.worker.full_checkpoint import write_full_checkpoint

    root = tmp_path_factory.mktemp("full-preset")
    config_only = tiny.write_checkpoint(root / "full", preset="full", config_only=True)
    # A config sglang reads differently from diffusers (sglang derives patch_latent_dim from the
    # patch size and latent channels): the check must catch it, or it would catch nothing.
    rejected = root / "rejected"
    shutil.copytree(config_only, rejected)
    cfg = json.loads((rejected / "transformer" / "config.json").read_text())
    cfg["patch_latent_dim"] = 96
    (rejected / "transformer" / "config.json").write_text(json.dumps(cfg))

    def stream(path, threads):
        return write_full_checkpoint(path, transformer_config=tiny.TRANSFORMER_CONFIG, vae_config=tiny.VAE_CONFIG,
                                     raw_action_dim=10, max_shard_bytes=256 << 10, threads=threads)

    streamed, streamed_again = stream(root / "streamed-1", 1), stream(root / "streamed-4", 4)
    report = _sglang_run(streamed, [config_only, rejected])
    return {"config_only": config_only, "streamed": streamed, "streamed_again": streamed_again,
            "run": report, "accepted": report["checks"][0], "rejected": report["checks"][1]}


@pytest.mark.sglang
def test_full_preset_config_is_what_sglang_builds_without_writing_weights(full_preset):
    from candidate_scheduler.worker.full_checkpoint import describe_preset
    from candidate_scheduler.worker.tiny_checkpoint import is_complete

    good = full_preset["config_only"]
    assert not list(good.rglob("*.safetensors")) and not is_complete(good)
    assert sum(p.stat().st_size for p in good.rglob("*") if p.is_file()) < 1 << 20
    manifest = json.loads((good / "tiny_checkpoint.json").read_text())
    assert manifest["preset"] == "full" and manifest["config_only"] is True
    summary = describe_preset("full")
    assert "14.55 Gparams" in summary and "29.10 GB" in summary, summary

    report = full_preset["accepted"]
    assert report["ok"], report
    assert report["pipeline_config"] == "Cosmos3Config" and report["is_nano"]
    transformer = report["transformer"]
    assert transformer["arch"] == {
        "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "action_dim": 64,
        "num_embodiment_domains": 32, "mrope_section": [24, 20, 20],
    }
    assert transformer["params"] == transformer["written_params"] == manifest["transformer_params"]
    assert 14.0e9 < transformer["params"] < 15.0e9
    vae = report["vae"]
    assert vae["arch"]["z_dim"] == 48 and vae["arch"]["base_dim"] == 160 and vae["arch"]["decoder_base_dim"] == 256
    assert vae["params"] == vae["written_params"] == manifest["vae_params"]
    # word-level splitting: about the real Qwen tokenizer's count, not one token per character
    assert 60 < report["tokenizer"]["action_prompt_tokens"] < 160

    rejected = full_preset["rejected"]
    assert not rejected["ok"]
    assert any(m.startswith("proj_in.weight") for m in rejected["transformer"]["shape_mismatch"])


@pytest.mark.sglang
def test_full_preset_writer_streams_shards_that_sglang_loads_and_runs(full_preset):
    """The full preset's writer (sharded, bf16, per-tensor seeds), at the tiny dimensions."""
    a, b = full_preset["streamed"], full_preset["streamed_again"]
    assert _files(a) == _files(b)
    for rel in _files(a):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel  # independent of thread scheduling
    index = json.loads((a / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 1 and all((a / "transformer" / f).exists() for f in shard_files)
    assert "lm_head.weight" not in index["weight_map"]  # dropped by sglang's mapping, never written

    report = full_preset["run"]
    assert report["shape"] == [16, 10] and report["finite"] and report["repeatable"]
    assert report["loaded_equals_files"] == {"vae": True, "transformer": True}
    _assert_denormalised_with(report, json.loads((a / "action_stats.json").read_text())["global"])
