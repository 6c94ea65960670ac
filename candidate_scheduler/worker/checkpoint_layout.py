"""What every checkpoint this project writes shares, whichever preset.

The file names and format version, the fixed parts of sglang 0.5.23's Cosmos3 transformer and of the
Wan2.2 VAE, the tiny preset's widths, the scheduler config and pipeline index, the action stats, the
WordLevel tokenizer and the deterministic JSON writer. tiny_checkpoint.py (the tiny weights and the
`make-checkpoint` command) and full_checkpoint.py (the streamed `full` preset) both build on it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

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


MODEL_INDEX = {
    "_class_name": "Cosmos3OmniPipeline",
    "_diffusers_version": "0.42.1",
    "transformer": ["diffusers", "Cosmos3OmniTransformer"],
    "vae": ["diffusers", "AutoencoderKLWan"],
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
}


def action_stats(raw_action_dim: int = RAW_ACTION_DIM) -> dict:
    # Only the "global" key: sglang's loadaction_stats reads one stats set per file (its
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


def write_wordlevel_tokenizer(out: Path, words: list[str] | None = None, split_pattern=None) -> None:
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


def replace_dir(tmp: Path, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def dump_json(path: Path, obj) -> None:
    # diffusers' bookkeeping list comes from a set: its order changes run to run, and loaders ignore it
    obj = {k: v for k, v in obj.items() if k != "_use_default_values"}
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(value):
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
