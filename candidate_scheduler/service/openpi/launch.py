"""The openpi front's command line, and how `serve` / `up` start it as a child process.

    python -m candidate_scheduler.service.openpi --scheduler-request tcp://127.0.0.1:5555 \\
        --scheduler-control tcp://127.0.0.1:5556 --bind 127.0.0.1 --port 8000 [--count 8 --reducer medoid ...]

The server-wide defaults (`--count`, `--reducer`, `--steps`, ...) are one list of flags, added to the
front's own parser bare and to `serve` / `up` with an `openpi-` prefix (`--openpi-count`), so the two
never drift apart. Unset, every default is the native protocol's.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from candidate_scheduler.service.endpoints import is_loopback_host
from candidate_scheduler.service.openpi import observation
from candidate_scheduler.service.processes import spawn_listening

DEFAULT_PORT = 8000  # openpi's serve_policy.py default


@dataclass(frozen=True)
class DefaultFlag:
    name: str  # the bare flag name, e.g. "count"
    type: Any
    section: str  # "candidates" | "sampling" | "" (top level)
    help: str
    choices: tuple | None = None


DEFAULT_FLAGS = (
    DefaultFlag("image-key", str, "", "read the image from this observation key only (default: 'observation/image', "
                                      "then 'image', then a single 'observation.images.<name>')"),
    DefaultFlag("prompt", str, "", "prompt of observations that send none (default '')"),
    DefaultFlag("seed", int, "", "base seed of observations that send none (default: a fresh random seed per call)"),
    DefaultFlag("float-range", str, "", "value range of float images (default 0,1)", observation.FLOAT_RANGES),
    DefaultFlag("deadline-s", float, "", "seconds from arrival before a call's group expires (default: none)"),
    DefaultFlag("count", int, "candidates", "candidates per call"),
    DefaultFlag("reducer", str, "candidates", "how candidates become the served action (mean, median, medoid, none)"),
    DefaultFlag("return-candidates", bool, "candidates", "also return every candidate [N, H, D]"),
    DefaultFlag("seed-policy", str, "candidates", "per_candidate | offset"),
    DefaultFlag("height", int, "sampling", "conditioning height"),
    DefaultFlag("width", int, "sampling", "conditioning width"),
    DefaultFlag("steps", int, "sampling", "denoising steps"),
    DefaultFlag("horizon", int, "sampling", "action horizon"),
    DefaultFlag("guidance-scale", float, "sampling", "classifier-free guidance scale"),
    DefaultFlag("domain-id", int, "sampling", "action domain id"),
    DefaultFlag("domain-name", str, "sampling", "embodiment name (resolved like sglang's Cosmos3 stage)"),
    DefaultFlag("raw-action-dim", int, "sampling", "action dims of the embodiment"),
    DefaultFlag("fps", int, "sampling", "frames per second of the action chunk"),
    DefaultFlag("negative-prompt", str, "sampling", "negative prompt (with guidance)"),
)


def _dest(flag: DefaultFlag, prefix: str) -> str:
    return (prefix + flag.name).replace("-", "_")


def add_default_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The server-wide observation defaults; `prefix` "openpi-" for `serve` / `up`."""
    for flag in DEFAULT_FLAGS:
        opt = f"--{prefix}{flag.name}"
        if flag.type is bool:
            parser.add_argument(opt, dest=_dest(flag, prefix), action="store_const", const=True, default=None,
                                help=f"openpi default: {flag.help}")
        else:
            parser.add_argument(opt, dest=_dest(flag, prefix), type=flag.type, default=None, choices=flag.choices,
                                help=f"openpi default: {flag.help}")
    parser.add_argument(f"--{prefix}max-frame-bytes", dest=f"{prefix}max_frame_bytes".replace("-", "_"), type=int,
                        default=None, help="largest observation frame read (default 32 MiB); frames up to twice "
                                           "that are refused with a text frame, bigger ones close the connection")
    parser.add_argument(f"--{prefix}request-timeout", dest=f"{prefix}request_timeout".replace("-", "_"), type=float,
                        default=None, help="seconds before a call is answered with an error and its group cancelled "
                                           "(default: wait)")
    parser.add_argument(f"--{prefix}model-name", dest=f"{prefix}model_name".replace("-", "_"), default=None,
                        help="model name in the openpi metadata (default cosmos3)")


def add_openpi_arguments(parser: argparse.ArgumentParser) -> None:
    """What `serve` and `up` add: --openpi-port (unset: no front), --openpi-host, the defaults."""
    parser.add_argument("--openpi-port", type=int, default=None,
                        help="start the openpi policy websocket on this port (0 = any free port; default off)")
    parser.add_argument("--openpi-host", default=None, help="bind address of the openpi websocket (default: --host)")
    parser.add_argument("--openpi-allow-nonlocal", action="store_true",
                        help="allow a non-loopback openpi bind address (it is unauthenticated)")
    add_default_arguments(parser, "openpi-")


def defaults_argv(args: argparse.Namespace, prefix: str = "openpi-") -> list[str]:
    """The front's bare flags for every default set on `args` (parsed with `prefix`)."""
    argv: list[str] = []
    for flag in DEFAULT_FLAGS:
        value = getattr(args, _dest(flag, prefix), None)
        if value is None:
            continue
        # --name=value: a value such as "-1,1" must not read as a flag
        argv.append(f"--{flag.name}" if flag.type is bool else f"--{flag.name}={value}")
    for name in ("max-frame-bytes", "request-timeout", "model-name"):
        value = getattr(args, (prefix + name).replace("-", "_"), None)
        if value is not None:
            argv.append(f"--{name}={value}")
    return argv


def front_defaults(args: argparse.Namespace) -> observation.FrontDefaults:
    """FrontDefaults from the front's own (bare) flags."""
    sections: dict[str, dict[str, Any]] = {"candidates": {}, "sampling": {}, "": {}}
    for flag in DEFAULT_FLAGS:
        value = getattr(args, _dest(flag, ""), None)
        if value is not None:
            sections[flag.section][flag.name.replace("-", "_")] = value
    top = sections[""]
    return observation.FrontDefaults(
        image_key=top.get("image_key"), prompt=top.get("prompt", ""), seed=top.get("seed"),
        candidates=sections["candidates"], sampling=sections["sampling"], float_range=top.get("float_range", "0,1"),
        deadline_s=top.get("deadline_s"),
    )


# ---- starting it from serve / up ------------------------------------------------------------------


def spawn_openpi_front(args: argparse.Namespace, bound: dict[str, str],
                       timeout_s: float = 60.0) -> tuple[subprocess.Popen | None, str | None]:
    """Start the front (its own process, like the sglang compat bridge) when `args.openpi_port` is set,
    and wait until it listens. Returns (process, "ws://host:port"), or (None, None) when off. Its
    output after the listening line is relayed to this process's stdout."""
    if getattr(args, "openpi_port", None) is None:
        return None, None
    host = getattr(args, "openpi_host", None) or getattr(args, "host", None) or "127.0.0.1"
    cmd = [sys.executable, "-m", "candidate_scheduler.service.openpi", "--scheduler-request", bound["request"],
           "--scheduler-control", bound["control"], "--bind", host, "--port", str(args.openpi_port)]
    if getattr(args, "openpi_allow_nonlocal", False):
        cmd.append("--allow-nonlocal")
    cmd += defaults_argv(args)
    proc, url = spawn_listening(cmd, r"listening on (ws://\S+)", "openpi-log", timeout_s)
    if url is None:
        raise SystemExit(f"the openpi front did not start (exit code {proc.returncode}); see its output above")
    return proc, url


# ---- the front's own command line -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.service.openpi",
                                description="openpi policy websocket in front of candidate_scheduler")
    p.add_argument("--scheduler-request", required=True, help="the scheduler's native request endpoint")
    p.add_argument("--scheduler-control", default=None,
                   help="the scheduler's control endpoint (metadata from STATS; cancels abandoned groups)")
    p.add_argument("--bind", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--allow-nonlocal", action="store_true", help="allow a non-loopback bind address (loud warning)")
    p.add_argument("--log-level", default="WARNING")
    add_default_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from candidate_scheduler.service.openpi.front import DEFAULT_MAX_FRAME_BYTES, READY_PREFIX, FrontConfig, OpenpiFront

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not is_loopback_host(args.bind):
        if not args.allow_nonlocal:
            print(f"refusing to bind the openpi websocket to {args.bind}: it is unauthenticated. Bind loopback, "
                  "or pass --allow-nonlocal (--openpi-allow-nonlocal on serve / up).", file=sys.stderr)
            return 2
        print("!" * 78 + f"\nWARNING: the openpi websocket is bound to NON-LOOPBACK {args.bind}. It is "
              "unauthenticated:\nanyone who reaches this port can submit work.\n" + "!" * 78, file=sys.stderr, flush=True)
    try:
        defaults = front_defaults(args)
    except ValueError as exc:
        print(f"bad openpi default: {exc}", file=sys.stderr)
        return 2
    config = FrontConfig(
        scheduler_request=args.scheduler_request, scheduler_control=args.scheduler_control, host=args.bind,
        port=args.port, defaults=defaults, model_name=args.model_name or "cosmos3",
        max_frame_bytes=args.max_frame_bytes or DEFAULT_MAX_FRAME_BYTES, request_timeout_s=args.request_timeout,
    )

    async def run() -> None:
        front = OpenpiFront(config)
        url = await front.start()
        print(f"{READY_PREFIX} {url} (scheduler {config.scheduler_request})", flush=True)
        task = asyncio.ensure_future(front.serve_forever())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass
        finally:
            await front.close()
            logging.getLogger("candidate_scheduler.service.openpi").warning("openpi front stopped: %s", front.stats)

    asyncio.run(run())
    return 0
