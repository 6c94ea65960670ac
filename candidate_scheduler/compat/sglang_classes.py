"""What sglang 0.5.23 defines that the compat code mirrors without importing sglang: the module paths
and class names a scheduler pickle may name, enum numbering, and OutputBatch's fields and defaults.

Every table here is checked against the installed sglang by tests/compat/test_allow_list.py; update
them together when the pinned sglang version moves."""

from __future__ import annotations

from typing import Any

SGLANG_VERSION = "0.5.23"

SCHEDULE_BATCH = "sglang.multimodal_gen.runtime.pipelines_core.schedule_batch"
SAMPLE = "sglang.multimodal_gen.configs.sample"
TASK_TYPE = "sglang.multimodal_gen.configs.task_type"
CONTROL = "sglang.multimodal_gen.runtime.entrypoints.control_requests"
IO_STRUCT = "sglang.multimodal_gen.runtime.entrypoints.post_training.io_struct"

# Every SamplingParams / ActionSamplingParams class defined under sglang.multimodal_gen.configs.sample in
# sglang 0.5.23 (tests/compat checks this list against the installed sglang), plus the parameter
# dataclasses those classes hold.
SAMPLING_PARAMS_CLASSES: dict[str, tuple[str, ...]] = {
    "action": ("ActionSamplingParams",),
    "anima": ("AnimaSamplingParams",),
    "cosmos3": ("Cosmos3SamplingParams",),
    "cosmos3_multiview": ("Cosmos3MultiviewSamplingParams",),
    "cosmos3_sim_auto": ("Cosmos3SimAutoSamplingParams",),
    "cosmos_dreams": ("CosmosDreamsSamplingParams",),
    "cosmos_dreams_transfer": ("CosmosDreamsTransferSamplingParams",),
    "diffusers_generic": ("DiffusersGenericSamplingParams",),
    "ernie_image": ("ErnieImageSamplingParams",),
    "flux3_action": ("Flux3ActionSamplingParams",),
    "flux": ("Flux2KleinBaseSamplingParams", "Flux2KleinSamplingParams", "Flux2SamplingParams", "FluxSamplingParams"),
    "glmimage": ("GlmImageSamplingParams",),
    "helios": ("HeliosDistilledSamplingParams", "HeliosMidSamplingParams", "HeliosT2VSamplingParams"),
    "hunyuan3d": ("Hunyuan3DSamplingParams",),
    "hunyuan": ("FastHunyuanSamplingParam", "HunyuanSamplingParams"),
    "hunyuan_image3": ("HunyuanImage3SamplingParams",),
    "ideogram": ("Ideogram4FastSamplingParams", "Ideogram4InstantSamplingParams", "Ideogram4SamplingParams"),
    "joy_echo": ("JoyEchoSamplingParams",),
    "joy_image": ("JoyImageEditSamplingParams",),
    "kandinsky6": ("Kandinsky6TI2VADistilledSamplingParams", "Kandinsky6TI2VASamplingParams"),
    "kandinsky6_sr": ("Kandinsky6SRSamplingParams",),
    "krea2": ("Krea2SamplingParams",),
    "lingbot_video_moe": ("LingBotVideoMoESamplingParams",),
    "lingbot_world": ("LingBotWorldSamplingParams",),
    "llada_image": ("LLaDAImageSamplingParams", "LLaDAImageTurboSamplingParams"),
    "longcat_image": ("LongCatImageEditSamplingParams", "LongCatImageEditTurboSamplingParams",
                      "LongCatImageSamplingParams"),
    "longlive2": ("LongLive2SamplingParams",),
    "ltx_2": ("LTX23HQSamplingParams", "LTX23SamplingParams", "LTX2SamplingParams"),
    "ltx_2_5": ("LTX25SamplingParams",),
    "ming_image": ("MingImageLayerSamplingParams", "MingImageSamplingParams"),
    "minimax_h3": ("FastH3OmniSamplingParams", "FastH3SamplingParams", "MiniMaxH3SamplingParams"),
    "minimax_h3_vdn": ("VDNH3SamplingParams",),
    "moss_image": ("MOSSImageSamplingParams",),
    "mova": ("MOVASamplingParams", "MOVA_360P_SamplingParams", "MOVA_720P_SamplingParams"),
    "nomas": ("NomasSamplingParams",),
    "pi05": ("Pi05SamplingParams",),
    "qwenimage21": ("QwenImage21SamplingParams",),
    "qwenimage": ("QwenImage2512SamplingParams", "QwenImageEditPlusSamplingParams", "QwenImageLayeredSamplingParams",
                  "QwenImageSamplingParams"),
    "sampling_params": ("SamplingParams",),
    "sana": ("SanaSamplingParams",),
    "sana_video2": ("SanaVideo2SamplingParams",),
    "sana_video": ("SanaVideoSamplingParams",),
    "sana_wm": ("SanaWMSamplingParams",),
    "sensenova_u1": ("SenseNovaU1SamplingParams",),
    "stablediffusion3": ("StableDiffusion3SamplingParams",),
    "wan": ("FastWanT2V480PConfig", "SelfForcingWanT2V480PConfig", "Turbo_Wan2_2_I2V_A14B_SamplingParam",
            "Wan2_1_Fun_1_3B_InP_SamplingParams", "Wan2_2_Base_SamplingParams", "Wan2_2_I2V_A14B_SamplingParam",
            "Wan2_2_T2V_A14B_SamplingParam", "Wan2_2_TI2V_5B_SamplingParam", "WanI2V_14B_480P_SamplingParam",
            "WanI2V_14B_720P_SamplingParam", "WanT2V_14B_SamplingParams", "WanT2V_1_3B_SamplingParams",
            "Wan_Animate_2_14B_Distilled_SamplingParam", "Wan_Animate_2_14B_SamplingParam"),
    "zimage": ("ZImageSamplingParams", "ZImageTurboSamplingParams"),
}
SAMPLING_AUX_CLASSES: dict[str, tuple[str, ...]] = {
    "sampling_params": ("CacheParams", "SkipSoftmaxParams"),
    "spectrum": ("SpectrumParams",),
    "teacache": ("TeaCacheParams",),
}
COSMOS3_SAMPLING_PARAMS = f"{SAMPLE}.cosmos3.Cosmos3SamplingParams"

# Enum members by value (enum.auto() numbering of sglang 0.5.23; checked by tests/compat).
ENUM_MEMBERS: dict[str, dict[int, str]] = {
    f"{TASK_TYPE}.DataType": {1: "IMAGE", 2: "VIDEO", 3: "MESH", 4: "ACTION"},
    f"{TASK_TYPE}.ModelTaskType": {1: "I2V", 2: "T2V", 3: "TI2V", 4: "T2I", 5: "I2I", 6: "TI2I", 7: "I2M",
                                    8: "VLA_ACTION", 9: "V2V", 10: "F2V"},
}
CONTROL_STRUCTS = ("SetLoraReq", "MergeLoraWeightsReq", "UnmergeLoraWeightsReq", "ListLorasReq", "ShutdownReq",
                   "ReleaseRealtimeSessionReq", "GetDisaggStatsReq")
POST_TRAINING_STRUCTS = ("UpdateWeightFromDiskReqInput", "UpdateWeightFromTensorReqInput",
                         "UpdateWeightFromTensorCheckerReqInput", "GetWeightsChecksumReqInput",
                         "ReleaseMemoryOccupationReqInput", "ResumeMemoryOccupationReqInput")
# What a Req carries besides its sampling params (state-only containers).
REQ_AUX_CLASSES = (
    ("sglang.multimodal_gen.runtime.utils.perf_logger", "RequestMetrics"),
    ("sglang.srt.observability.trace", "TraceNullContext"),
)
PIL_IMAGE_CLASSES = (
    ("PIL.Image", "Image"),
    ("PIL.PngImagePlugin", "PngImageFile"),
    ("PIL.JpegImagePlugin", "JpegImageFile"),
    ("PIL.WebPImagePlugin", "WebPImageFile"),
    ("PIL.BmpImagePlugin", "BmpImageFile"),
    ("PIL.GifImagePlugin", "GifImageFile"),
    ("PIL.TiffImagePlugin", "TiffImageFile"),
    ("PIL.MpoImagePlugin", "MpoImageFile"),
)

# OutputBatch's fields and defaults (a reply must carry exactly these to unpickle as sglang's dataclass).
OUTPUT_BATCH_DEFAULTS: dict[str, Any] = {
    "output": None, "raw_frame_batches": None, "raw_frame_content_type": "application/x-raw-rgb",
    "raw_frame_metadata": None, "audio": None, "audio_sample_rate": None, "fps": None, "action_pred": None,
    "action_mode": None, "action_domain_id": None, "action_raw_action_dim": None, "trajectory_timesteps": None,
    "trajectory_latents": None, "rollout_trajectory_data": None, "trajectory_decoded": None, "error": None,
    "output_file_paths": None, "output_image_bytes": None, "lidar": None, "metrics": None, "metrics_list": None,
    "noise_pred": None, "peak_memory_mb": 0.0, "usage": None,
}
