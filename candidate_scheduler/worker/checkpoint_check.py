"""Check a checkpoint directory against sglang's own loader without allocating a weight.

For a preset too large to write in CI (or to write before knowing it loads): sglang picks the
pipeline config from model_index.json, reads each component config with its own reader, applies
it to its arch configs, and builds its Cosmos3 transformer and Wan VAE on the `meta` device. The
tensors the preset would write (names and shapes from the diffusers classes, also on `meta`) are
then renamed and fused with sglang's own weight mapping and compared, one by one, to what sglang's
modules expect. The prompt is tokenized by sglang's Cosmos3 tokenization stage.

Run it in a process of its own (sglang keeps global server args and a process-wide distributed
group): `python -m candidate_scheduler.worker.checkpoint_check DIR` prints a JSON report and exits
non-zero when anything does not match.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from candidate_scheduler.worker import checkpoint_shards as shards


def _init_sglang(model_dir: str):
    from candidate_scheduler.worker.cosmos3_sglang import free_port, prepare_environment

    prepare_environment()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from sglang.multimodal_gen.runtime.distributed.parallel_state import (
        maybe_init_distributed_environment_and_model_parallel,
    )
    from sglang.multimodal_gen.runtime.server_args import ServerArgs, set_global_server_args

    server_args = ServerArgs.from_kwargs(model_path=model_dir, attention_backend="torch_sdpa")
    set_global_server_args(server_args)
    maybe_init_distributed_environment_and_model_parallel(tp_size=1, sp_size=1)
    return server_args


def _meta_state(specs) -> dict:
    import torch

    return {s.name: torch.empty(s.shape, dtype=torch.bfloat16, device="meta") for s in specs}


def _compare(provided: dict, expected: dict) -> dict:
    missing = sorted(k for k in expected if k not in provided)
    unexpected = sorted(k for k in provided if k not in expected)
    mismatched = sorted(
        f"{k}: {tuple(provided[k].shape)} vs {tuple(expected[k].shape)}"
        for k in expected
        if k in provided and tuple(provided[k].shape) != tuple(expected[k].shape)
    )
    return {"missing": missing, "unexpected": unexpected, "shape_mismatch": mismatched,
            "params": sum(t.numel() for t in expected.values())}


def _check_transformer(model_dir: str, server_args, skip: tuple[str, ...]) -> dict:
    import torch
    from diffusers import Cosmos3OmniTransformer
    from sglang.multimodal_gen.runtime.loader.utils import (
        get_param_names_mapping,
        hf_to_custom_state_dict,
        initialize_model,
    )
    from sglang.multimodal_gen.runtime.models.registry import ModelRegistry
    from sglang.multimodal_gen.runtime.utils.hf_diffusers_utils import get_diffusers_component_config

    config = get_diffusers_component_config(component_path=os.path.join(model_dir, "transformer"))
    written = json.loads((Path(model_dir) / "transformer" / "config.json").read_text())
    dit_config = server_args.pipeline_config.dit_config
    dit_config.update_model_arch(dict(config))
    model_cls, _ = ModelRegistry.resolve_model_cls(config.pop("_class_name"))
    model = initialize_model(model_cls, {"config": dit_config, "hf_config": config, "quant_config": None},
                             torch.bfloat16, torch.device("meta"))
    expected = model.state_dict()

    diffusers_cfg = {k: v for k, v in written.items() if not k.startswith("_")}
    diffusers_model = shards.build_on_meta(Cosmos3OmniTransformer, diffusers_cfg)
    specs = shards.tensor_specs(diffusers_model, skip)
    mapping = get_param_names_mapping(model.param_names_mapping, valid_target_names=set(expected))
    provided, _ = hf_to_custom_state_dict(_meta_state(specs), mapping, valid_target_names=set(expected),
                                          strict=True)
    arch = dit_config.arch_config
    report = _compare(provided, expected)
    report.update(
        class_name=model_cls.__name__,
        written_params=shards.count_params(specs),
        arch={k: getattr(arch, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "head_dim", "intermediate_size",
                                             "vocab_size", "action_dim", "num_embodiment_domains")}
        | {"mrope_section": list(arch.mrope_section)},
    )
    return report


def _check_vae(model_dir: str, server_args) -> dict:
    import torch
    from diffusers import AutoencoderKLWan
    from sglang.multimodal_gen.runtime.loader.utils import initialize_model
    from sglang.multimodal_gen.runtime.models.registry import ModelRegistry
    from sglang.multimodal_gen.runtime.utils.hf_diffusers_utils import get_diffusers_component_config

    config = get_diffusers_component_config(component_path=os.path.join(model_dir, "vae"))
    written = json.loads((Path(model_dir) / "vae" / "config.json").read_text())
    vae_config = server_args.pipeline_config.vae_config
    vae_config.update_model_arch(dict(config))
    if hasattr(vae_config, "post_init"):
        vae_config.post_init()
    vae_cls, _ = ModelRegistry.resolve_model_cls(config.pop("_class_name"))
    vae = initialize_model(vae_cls, {"config": vae_config}, torch.bfloat16, torch.device("meta"))
    expected = dict(vae.state_dict())

    import inspect

    accepted = set(inspect.signature(AutoencoderKLWan.__init__).parameters)
    diffusers_model = shards.build_on_meta(AutoencoderKLWan, {k: v for k, v in written.items() if k in accepted})
    specs = shards.tensor_specs(diffusers_model)
    report = _compare(_meta_state(specs), expected)
    arch = vae_config.arch_config
    report.update(class_name=vae_cls.__name__, written_params=shards.count_params(specs),
                  arch={k: getattr(arch, k) for k in ("z_dim", "base_dim", "decoder_base_dim", "num_res_blocks",
                                                       "patch_size", "scale_factor_spatial", "clip_output")})
    return report


def _check_tokenizer(model_dir: str, vocab_size: int) -> dict:
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3 import (
        Cosmos3TokenizationStage,
    )
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3_action import (
        build_action_prompt,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(model_dir, "text_tokenizer"))
    stage = Cosmos3TokenizationStage(tokenizer)
    prompt = build_action_prompt("open the drawer", "ego_view", 17, 5.0, 480, 832)
    ids, _mask, seq_len = stage._tokenize_prompt(prompt, 4096, "cpu")
    used = ids[0, :seq_len]
    return {"action_prompt_tokens": int(seq_len), "max_id": int(used.max()), "ids_in_vocab": int(used.max()) < vocab_size,
            "unknown_tokens": int((used == tokenizer.unk_token_id).sum())}


def check(model_dir: str | os.PathLike) -> dict:
    """Everything sglang's loader would see of model_dir, short of reading a weight."""
    from candidate_scheduler.worker.full_checkpoint import PRESETS
    from candidate_scheduler.worker.tiny_checkpoint import MANIFEST_FILE

    model_dir = str(Path(model_dir).resolve())
    manifest = json.loads((Path(model_dir) / MANIFEST_FILE).read_text())
    preset = PRESETS[manifest.get("preset", "tiny")]
    server_args = _init_sglang(model_dir)
    from sglang.multimodal_gen.configs.pipeline_configs.cosmos3 import is_nano_checkpoint

    transformer = _check_transformer(model_dir, server_args, preset.skip_transformer_keys)
    report = {
        "preset": preset.name,
        "pipeline_config": type(server_args.pipeline_config).__name__,
        "is_nano": bool(is_nano_checkpoint(model_dir)),
        "transformer": transformer,
        "vae": _check_vae(model_dir, server_args),
        "tokenizer": _check_tokenizer(model_dir, transformer["arch"]["vocab_size"]),
    }
    report["ok"] = all(
        not report[c][k] for c in ("transformer", "vae") for k in ("missing", "unexpected", "shape_mismatch")
    ) and report["tokenizer"]["ids_in_vocab"]
    return report


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess by the tests
    result = check(sys.argv[1])
    print(json.dumps(result, indent=2, default=str))
    sys.exit(0 if result["ok"] else 1)
