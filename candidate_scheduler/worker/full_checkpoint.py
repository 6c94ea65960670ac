"""The `full` checkpoint preset: random weights with the real Cosmos3 Nano dimensions.

A GPU run on it measures real shapes without downloading weights. The dimensions are those of
sglang 0.5.23's Cosmos3 configs: `Cosmos3VideoArchConfig` (configs/models/dits/cosmos3video.py,
"Qwen3-8B-derived", the (4096, 36, 32) signature `is_nano_checkpoint` looks for) and the
Wan2.2-TI2V-5B VAE Cosmos3 ships (AutoencoderKLWan, z_dim 48, base_dim 160, decoder 256).
Weights are bf16 on disk and streamed shard by shard (checkpoint_shards.py): about 29 GB for the
transformer and 1.4 GB for the VAE, never more than two shards in memory.

The tokenizer is not Qwen's (that would be a download): a WordLevel vocabulary split with Qwen2's
pre-tokenizer pattern, so a prompt gets about as many text tokens as the real tokenizer gives it
(the UND pass and the GEN cross-attention scale with that length); words outside the small
vocabulary become <unk>, which random weights do not mind.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from candidate_scheduler.worker import checkpoint_layout as layout
from candidate_scheduler.worker import checkpoint_shards as shards

DEFAULT_SHARD_BYTES = 2 << 30
# Inherited from the text backbone and dropped by sglang's weight mapping ("^lm_head\\.weight$" and
# "^norm\\.weight$" map to ""): writing them would cost 1.2 GB and time for nothing.
UNUSED_TRANSFORMER_KEYS = ("lm_head.weight", "norm.weight")

FULL_TRANSFORMER_CONFIG = {
    **layout.COSMOS3_TRANSFORMER,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 36,
    "rope_scaling": {"mrope_section": [24, 20, 20]},
    "vocab_size": 151936,
}

# Wan2.2-TI2V-5B's published vae/config.json values (latent statistics included).
WAN22_LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.157, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.123, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.052, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]
WAN22_LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.499, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.06, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]
FULL_VAE_CONFIG = {
    **layout.WAN22_VAE,
    "base_dim": 160,
    "decoder_base_dim": 256,
    "num_res_blocks": 2,
    "latents_mean": WAN22_LATENTS_MEAN,
    "latents_std": WAN22_LATENTS_STD,
}
# sglang-only VAE keys (WanVAEArchConfig) that diffusers' constructor does not take: Wan2.2 does
# not clamp its decoded output.
FULL_VAE_EXTRA_CONFIG = {"clip_output": False}

# Qwen2's pre-tokenizer pattern (contractions, letter runs, single digits, punctuation runs, spaces).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Text the vocabulary is cut from: sglang's Cosmos3 action caption (build_action_prompt) and a few
# instruction words, so most of a policy prompt maps to real ids rather than <unk>.
VOCAB_CORPUS = (
    '{"cinematography": {"framing": "This video is captured from a first-person perspective looking at '
    'the scene. This video is captured from a third-person perspective looking towards the agent from '
    'the front. This video is captured from a wrist-mounted camera. This video contains concatenated '
    'views from multiple camera perspectives."}, "actions": [{"time": "0:00-0:03", "description": '
    '"open the drawer."}], "duration": "3s", "fps": 5.0, "resolution": {"H": 480, "W": 832}, '
    '"aspect_ratio": "16,9"} user assistant system pick up place put close push pull move lift the '
    "a an and to of in on into onto with red blue green cup bowl block box door handle table robot arm "
    "gripper left right top bottom"
)


@dataclass(frozen=True)
class Preset:
    name: str
    transformer_config: dict
    vae_config: dict
    vae_extra_config: dict = field(default_factory=dict)
    skip_transformer_keys: tuple[str, ...] = ()
    word_tokenizer: bool = False


PRESETS = {
    "tiny": Preset("tiny", layout.TRANSFORMER_CONFIG, layout.VAE_CONFIG),
    "full": Preset("full", FULL_TRANSFORMER_CONFIG, FULL_VAE_CONFIG, FULL_VAE_EXTRA_CONFIG,
                   UNUSED_TRANSFORMER_KEYS, word_tokenizer=True),
}


def word_vocabulary() -> list[str]:
    from tokenizers import Regex, pre_tokenizers

    words = list(layout.SPECIAL_TOKENS) + [chr(c) for c in range(33, 127)] + ["\n"]
    split = pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated")
    seen = set(words)
    for piece, _ in split.pre_tokenize_str(VOCAB_CORPUS):
        for word in (piece, piece.strip()):
            if word and word not in seen:
                seen.add(word)
                words.append(word)
    return words


def write_tokenizer(folder: Path, preset: Preset) -> None:
    if not preset.word_tokenizer:
        layout.write_wordlevel_tokenizer(folder)
        return
    from tokenizers import Regex

    words = word_vocabulary()
    if len(words) > preset.transformer_config["vocab_size"]:
        raise ValueError(f"tokenizer has {len(words)} words, more than the model's vocabulary")
    layout.write_wordlevel_tokenizer(folder, words, Regex(QWEN2_SPLIT_PATTERN))


@dataclass(frozen=True)
class Plan:
    """What a preset writes: configs and every tensor's name and shape, without any weights."""

    transformer_config: dict
    vae_config: dict
    transformer_specs: list
    vae_specs: list

    @property
    def transformer_params(self) -> int:
        return shards.count_params(self.transformer_specs)

    @property
    def vae_params(self) -> int:
        return shards.count_params(self.vae_specs)

    def disk_bytes(self) -> int:
        return 2 * (self.transformer_params + self.vae_params)  # bf16; headers and JSON are noise


def plan(preset: Preset) -> Plan:
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    transformer = shards.build_on_meta(Cosmos3OmniTransformer, preset.transformer_config)
    vae = shards.build_on_meta(AutoencoderKLWan, preset.vae_config)
    tcfg = layout.component_config(transformer)
    vcfg = layout.component_config(vae, **preset.vae_extra_config)
    return Plan(tcfg, vcfg, shards.tensor_specs(transformer, preset.skip_transformer_keys), shards.tensor_specs(vae))


def _amount(n: float, unit: str) -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}"


def describe(p: Plan, name: str) -> str:
    return (f"{name} preset: transformer {_amount(p.transformer_params, 'params')} "
            f"({_amount(2 * p.transformer_params, 'B')} bf16), vae {_amount(p.vae_params, 'params')} "
            f"({_amount(2 * p.vae_params, 'B')} bf16), about {_amount(p.disk_bytes(), 'B')} of weights on disk")


def describe_preset(name: str) -> str:
    return describe(plan(PRESETS[name]), name)


def _write_configs(tmp: Path, p: Plan, preset: Preset, raw_action_dim: int) -> None:
    (tmp / "transformer").mkdir()
    layout.dump_json(tmp / "transformer" / "config.json", p.transformer_config)
    (tmp / "vae").mkdir()
    layout.dump_json(tmp / "vae" / "config.json", p.vae_config)
    (tmp / "scheduler").mkdir()
    layout.dump_json(tmp / "scheduler" / "scheduler_config.json", layout.SCHEDULER_CONFIG)
    write_tokenizer(tmp / "text_tokenizer", preset)
    layout.dump_json(tmp / "model_index.json", layout.MODEL_INDEX)
    layout.dump_json(tmp / layout.STATS_FILE, layout.action_stats(raw_action_dim))


def _manifest(p: Plan, preset: Preset, raw_action_dim: int, **extra) -> dict:
    return {
        "format_version": layout.FORMAT_VERSION,
        "preset": preset.name,
        "seed": layout.SEED,
        "raw_action_dim": raw_action_dim,
        "transformer_params": p.transformer_params,
        "vae_params": p.vae_params,
        **extra,
    }


def _staging_dir(out_dir: Path) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))


def write_preset(out_dir, preset: str | Preset, *, raw_action_dim: int = layout.RAW_ACTION_DIM,
                 config_only: bool = False, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                 threads: int | None = None, log=None) -> Path:
    """Write a preset into out_dir atomically; config_only writes everything but the weights."""
    chosen = PRESETS[preset] if isinstance(preset, str) else preset
    return _write(Path(out_dir), chosen, raw_action_dim, config_only=config_only,
                  max_shard_bytes=max_shard_bytes, threads=threads, log=log)


def write_full_checkpoint(out_dir, *, transformer_config: dict | None = None, vae_config: dict | None = None,
                          **kwargs) -> Path:
    """The full preset; transformer_config / vae_config replace its dimensions (tests stream a small
    model through the same writer). Other keywords as for write_preset."""
    base = PRESETS["full"]
    preset = Preset(base.name, transformer_config or base.transformer_config, vae_config or base.vae_config,
                    base.vae_extra_config, base.skip_transformer_keys, base.word_tokenizer)
    return write_preset(out_dir, preset, **kwargs)


def _write(out_dir: Path, preset: Preset, raw_action_dim: int, *, config_only: bool,
           max_shard_bytes: int = DEFAULT_SHARD_BYTES, threads: int | None = None, log=None) -> Path:
    import torch

    layout.check_raw_action_dim(raw_action_dim, preset.transformer_config["action_dim"])
    p = plan(preset)
    tmp = _staging_dir(out_dir)
    try:
        _write_configs(tmp, p, preset, raw_action_dim)
        if config_only:
            manifest = _manifest(p, preset, raw_action_dim, config_only=True)
        else:
            started = time.monotonic()
            written = 0

            def progress(file_name: str, nbytes: int) -> None:
                nonlocal written
                written += nbytes
                if log is not None:
                    log(f"make-checkpoint: {file_name} ({_amount(written, 'B')} of {_amount(p.disk_bytes(), 'B')}, "
                        f"{time.monotonic() - started:.0f} s)")

            digests = {}
            for component, specs in (("transformer", p.transformer_specs), ("vae", p.vae_specs)):
                digests[component] = shards.write_random_shards(
                    tmp / component, specs, seed=layout.SEED, dtype=torch.bfloat16,
                    max_shard_bytes=max_shard_bytes, threads=threads, progress=progress)
            manifest = _manifest(p, preset, raw_action_dim, tensors_sha256=digests)
        layout.dump_json(tmp / layout.MANIFEST_FILE, manifest)
        layout.replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
