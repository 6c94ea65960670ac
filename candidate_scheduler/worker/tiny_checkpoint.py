"""Write a random-weight Cosmos3 checkpoint that sglang 0.5.23 loads as Cosmos3Pipeline.

Nothing is downloaded: every weight comes from a fixed torch seed, the tokenizer is a WordLevel
vocabulary built here, and the files are written in a fixed order so the same command twice gives
byte-identical weights. Two presets:
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

DEFAULT_DIR = Path(".cache/tiny-cosmos3")
SEED = 20261130
VOCAB_SIZE = 1024
RAW_ACTION_DIM = 7  # raw action dimension of the tiny embodiment (DROID-like: 6 joints + gripper)
STATS_FILE = "action_stats.json"
MANIFEST_FILE = "tiny_checkpoint.json"
FORMAT_VERSION = 2

# What every preset shares: the fixed parts of sglang 0.5.23's Cosmos3 transformer (latent and patch
# channels, RoPE base, the action head, no sound head) and of the Wan2.2 VAE layout Cosmos3 ships.
# A preset adds its widths, depths and the VAE's latent statistics.
COSMOS3_TRANSFORMER = {
    "latent_channel": 48,
    "latent_patch_size": 2,
    "patch_latent_dim": 192,
    "rope_theta": 5000000.0,
    "action_gen": True,
    "action_dim": 64,
    "num_embodiment_domains": 32,
    "sound_gen": False,  # a policy checkpoint: the action head, no sound head
}
WAN22_VAE = {
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 16,
}

TRANSFORMER_CONFIG = {
    **COSMOS3_TRANSFORMER,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "rope_scaling": {"mrope_section": [4, 2, 2]},
    "vocab_size": VOCAB_SIZE,
}

VAE_CONFIG = {
    **WAN22_VAE,
    "base_dim": 16,
    "num_res_blocks": 1,
    "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
}

SCHEDULER_CONFIG = {
    "_class_name": "UniPCMultistepScheduler",
    "_diffusers_version": "0.42.1",
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 10.0,
    "solver_order": 2,
    "solver_type": "bh2",
    "predict_x0": True,
    "lower_order_final": True,
    "final_sigmas_type": "zero",
    "timestep_spacing": "linspace",
}

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<unk>",
]

# Qwen-style chat template: enough structure for sglang's apply_chat_template call.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


PRESETS = ("tiny", "full")
MODEL_INDEX = {
    "_class_name": "Cosmos3OmniPipeline",
    "_diffusers_version": "0.42.1",
    "transformer": ["diffusers", "Cosmos3OmniTransformer"],
    "vae": ["diffusers", "AutoencoderKLWan"],
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
}


def _action_stats(raw_action_dim: int = RAW_ACTION_DIM) -> dict:
    # Only the "global" key: sglang's load_action_stats reads one stats set per file (its
    # stats_key is never passed per domain), so a checkpoint covers one action width.
    # Ranges differ per dimension so a wrong denormalisation is visible in tests.
    q01 = [-1.0 - 0.25 * i for i in range(raw_action_dim)]
    q99 = [1.0 + 0.5 * i for i in range(raw_action_dim)]
    return {
        "global": {
            "q01": q01,
            "q99": q99,
            "min": [v - 0.1 for v in q01],
            "max": [v + 0.1 for v in q99],
            "mean": [0.05 * i for i in range(raw_action_dim)],
            "std": [1.0 + 0.1 * i for i in range(raw_action_dim)],
        }
    }


def check_raw_action_dim(raw_action_dim: int, action_dim: int) -> int:
    """The stats width must fit the model's padded action channels (sglang slices to it)."""
    if isinstance(raw_action_dim, bool) or not isinstance(raw_action_dim, int) or not 1 <= raw_action_dim <= action_dim:
        raise ValueError(f"raw_action_dim must be an int in [1, {action_dim}], got {raw_action_dim!r}")
    return raw_action_dim


def _vocabulary() -> list[str]:
    words = list(SPECIAL_TOKENS)
    # ASCII printable characters and a few frequent JSON fragments the action prompt uses.
    words += [chr(c) for c in range(33, 127)]
    words += ["Ġ", "Ċ", "user", "assistant", "system"]
    i = 0
    while len(words) < VOCAB_SIZE:
        words.append(f"<extra_{i}>")
        i += 1
    return words


def _write_tokenizer(out: Path, words: list[str] | None = None, split_pattern=None) -> None:
    """A WordLevel tokenizer with Qwen-style specials. By default it splits into single characters
    so any prompt tokenizes without unknown-heavy output; the full preset passes a word-splitting
    pattern so prompts get about as many tokens as the real Qwen tokenizer gives them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words if words is not None else _vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=split_pattern if split_pattern is not None else "",
                                             behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|vision_start|>", "<|vision_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def component_config(module, **extra) -> dict:
    """A component's config.json: diffusers' config plus the class and version its loader reads."""
    return dict(module.config, _class_name=type(module).__name__, _diffusers_version="0.42.1", **extra)


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
            _dump_json(tmp / component / "config.json", component_config(module))
            _save_safetensors(module, tmp / component / "diffusion_pytorch_model.safetensors", dtype)

        (tmp / "scheduler").mkdir()
        _dump_json(tmp / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)

        _write_tokenizer(tmp / "text_tokenizer")

        _dump_json(tmp / "model_index.json", MODEL_INDEX)
        _dump_json(tmp / STATS_FILE, _action_stats(raw_action_dim))
        _dump_json(
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


def replace_dir(tmp: Path, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


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


def _dump_json(path: Path, obj) -> None:
    # diffusers' bookkeeping list comes from a set: its order changes run to run, and loaders ignore it
    obj = {k: v for k, v in obj.items() if k != "_use_default_values"}
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(value):
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


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
