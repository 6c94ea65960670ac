"""Write a random-weight Cosmos3 checkpoint that sglang 0.5.23 loads as Cosmos3Pipeline.

Nothing is downloaded: every weight comes from a fixed torch seed, the tokenizer is a WordLevel
vocabulary (checkpoint_layout.py), and the files are written in a fixed order so the same command
twice gives byte-identical weights. Two presets:
- `tiny` (the default): a ~0.5M-parameter DiT whose shapes follow a config sglang's loader is known
  to accept (see shared/reference/sglang-0.5.23-notes.md section 5); about 14 MB, written in seconds.
- `full`: the real Cosmos3 Nano dimensions, streamed to disk shard by shard (full_checkpoint.py).
`raw_action_dim` sets how many action dims the action stats cover, so requests for a real
embodiment's width (droid_lerobot: 10) are accepted; the weights do not depend on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from candidate_scheduler.worker.checkpoint_layout import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_INDEX,
    RAW_ACTION_DIM,
    SCHEDULER_CONFIG,
    SEED,
    STATS_FILE,
    TRANSFORMER_CONFIG,
    VAE_CONFIG,
    action_stats,
    check_raw_action_dim,
    component_config,
    dump_json,
    replace_dir,
    write_wordlevel_tokenizer,
)

DEFAULT_DIR = Path(".cache/tiny-cosmos3")

PRESETS = ("tiny", "full")


def _init_weights(module, generator) -> None:
    import torch

    with torch.no_grad():
        for name, param in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            if param.ndim <= 1 and ("norm" in name or name.endswith("gamma")):
                param.fill_(1.0)
            else:
                # Biases are random too: a zero bias hides kernel-path differences (F.linear on a
                # non-contiguous input) that real checkpoints expose.
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_((noise * 0.02).to(param.dtype))


def _save_safetensors(module, path: Path, dtype) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to(dtype).contiguous() for k, v in sorted(module.state_dict().items())}
    save_file(state, str(path), metadata={"format": "pt"})


def write_checkpoint(
    out_dir: str | os.PathLike = DEFAULT_DIR,
    *,
    preset: str = "tiny",
    raw_action_dim: int = RAW_ACTION_DIM,
    config_only: bool = False,
    log=None,
) -> Path:
    """Write the checkpoint into out_dir atomically (a temp dir renamed into place).

    config_only writes every config, the tokenizer and the stats but no weights: a directory to
    check a preset's shapes against sglang's loader without writing gigabytes. It is never taken
    for a complete checkpoint (`is_complete` is false)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown checkpoint preset {preset!r}; expected one of {', '.join(PRESETS)}")
    if preset == "full" or config_only:
        # Streamed from a meta-device plan; the tiny weights keep the path below, the one existing
        # checkpoints were written with (its bytes must not change).
        from candidate_scheduler.worker.full_checkpoint import write_preset

        return write_preset(out_dir, preset, raw_action_dim=raw_action_dim, config_only=config_only, log=log)
    check_raw_action_dim(raw_action_dim, TRANSFORMER_CONFIG["action_dim"])
    import torch
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-cosmos3-", dir=out_dir.parent))
    try:
        gen = torch.Generator().manual_seed(SEED)
        # One generator across both, transformer first: the order the existing checkpoints were drawn in.
        for component, module_cls, config, dtype in (
            ("transformer", Cosmos3OmniTransformer, TRANSFORMER_CONFIG, torch.bfloat16),
            ("vae", AutoencoderKLWan, VAE_CONFIG, torch.float32),
        ):
            (tmp / component).mkdir()
            module = module_cls(**config)
            _init_weights(module, gen)
            dump_json(tmp / component / "config.json", component_config(module))
            _save_safetensors(module, tmp / component / "diffusion_pytorch_model.safetensors", dtype)

        (tmp / "scheduler").mkdir()
        dump_json(tmp / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)

        write_wordlevel_tokenizer(tmp / "text_tokenizer")

        dump_json(tmp / "model_index.json", MODEL_INDEX)
        dump_json(tmp / STATS_FILE, action_stats(raw_action_dim))
        dump_json(
            tmp / MANIFEST_FILE,
            {
                "format_version": FORMAT_VERSION,
                "seed": SEED,
                "raw_action_dim": raw_action_dim,
                "weights_sha256": weights_digest(tmp),
            },
        )
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def weights_digest(model_dir: str | os.PathLike) -> str:
    h = hashlib.sha256()
    for path in sorted(Path(model_dir).rglob("*.safetensors")):
        h.update(path.relative_to(model_dir).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def is_complete(model_dir: str | os.PathLike) -> bool:
    manifest = Path(model_dir) / MANIFEST_FILE
    if not manifest.exists():
        return False
    try:
        meta = json.loads(manifest.read_text())
    except ValueError:
        return False
    return meta.get("format_version") == FORMAT_VERSION and not meta.get("config_only", False)


def ensure_checkpoint(model_dir: str | os.PathLike = DEFAULT_DIR) -> Path:
    """Return model_dir, writing the checkpoint first if it is missing or from an older format."""
    if not is_complete(model_dir):
        write_checkpoint(model_dir)
    return Path(model_dir)


def add_make_checkpoint_arguments(parser) -> None:
    """The `make-checkpoint` options; cli.py and `python -m` share them."""
    parser.add_argument("dir", nargs="?", default=str(DEFAULT_DIR), help="output directory")
    parser.add_argument("--preset", choices=PRESETS, default="tiny",
                        help="tiny: a ~14 MB test model; full: Cosmos3 Nano dimensions, ~30 GB bf16")
    parser.add_argument("--raw-action-dim", type=int, default=RAW_ACTION_DIM,
                        help="action dims the action stats cover (droid_lerobot: 10)")
    parser.add_argument("--config-only", action="store_true",
                        help="write configs, tokenizer and stats but no weights (shape checks, size estimates)")


def run_make_checkpoint(args) -> int:
    """Write the checkpoint the parsed `make-checkpoint` arguments ask for; prints its path."""
    if args.preset == "full" or args.config_only:
        from candidate_scheduler.worker.full_checkpoint import describe_preset

        print(describe_preset(args.preset), flush=True)
    try:
        path = write_checkpoint(args.dir, preset=args.preset, raw_action_dim=args.raw_action_dim,
                                config_only=args.config_only, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as exc:
        print(f"make-checkpoint: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover - the CLI's make-checkpoint is the entry point
    import argparse

    cli = argparse.ArgumentParser(prog="python -m candidate_scheduler.worker.tiny_checkpoint")
    add_make_checkpoint_arguments(cli)
    sys.exit(run_make_checkpoint(cli.parse_args()))
