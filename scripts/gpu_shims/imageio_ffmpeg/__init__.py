"""Stand-in for imageio_ffmpeg on a lent GPU machine that lacks it (`make gpu-check`).

Its wheel (68 MB: an ffmpeg binary inside) does not fit a device call's 64 MiB. sglang imports it at
module level in entrypoints/utils.py, beside output helpers the worker's generation path uses; only
writing video calls it, which a check never does. Where an ffmpeg is on PATH it is that one."""

import shutil

__version__ = "0+stand-in"
STAND_IN = True


def get_ffmpeg_exe() -> str:
    exe = shutil.which("ffmpeg")
    if exe is None:
        raise RuntimeError("imageio_ffmpeg stand-in (scripts/gpu_shims): no ffmpeg on PATH")
    return exe


def get_ffmpeg_version() -> str:
    raise RuntimeError("imageio_ffmpeg stand-in (scripts/gpu_shims): no ffmpeg version")
