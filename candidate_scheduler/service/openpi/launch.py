"""The openpi front's command line, and how `serve` / `up` start it as a child process.

    python -m candidate_scheduler.service.openpi --scheduler-request tcp://127.0.0.1:5555 \\
        --scheduler-control tcp://127.0.0.1:5556 --bind 127.0.0.1 --port 8000 [--count 8 --reducer medoid ...]

Who may connect: with `--tokens DIR` every connection needs a bearer token of that key directory (even
on loopback); without it the front is unauthenticated and binds loopback only, unless `--insecure` (a
loud warning). `serve` hands the front its tokens (`--openpi-tokens`, by default its `--curve-dir`) and,
when its sockets take CURVE keys, a run-time proxy key pair in the environment (`keys.ENV_KEYS`).

The server-wide defaults (`--count`, `--reducer`, `--steps`, ...) are one list of flags, added to the
front's own parser bare and to `serve` / `up` with an `openpi-` prefix (`--openpi-count`), so the two
never drift apart. Unset, every default is the native protocol's.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from candidate_scheduler.arg_types import port, positive_int, positive_seconds
from candidate_scheduler.service.endpoints import is_loopback_host
from candidate_scheduler.service.keys import ENV_KEYS, ClientKeys
from candidate_scheduler.service.openpi import observation
from candidate_scheduler.service.tls import TlsError, cleartext_token_warning, pair_refusal, server_context

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
    # refused here, not served with: a timeout <= 0 or NaN answered every call "no result within -1.0 s", and
    # a frame limit of 0 read as the default
    parser.add_argument(f"--{prefix}max-frame-bytes", dest=f"{prefix}max_frame_bytes".replace("-", "_"),
                        type=positive_int, default=None,
                        help="largest observation frame read (default 32 MiB); frames up to twice that are refused "
                             "with a text frame, bigger ones close the connection")
    parser.add_argument(f"--{prefix}max-connections", dest=f"{prefix}max_connections".replace("-", "_"),
                        type=positive_int, default=None,
                        help="open websocket connections at once (default 256); a robot past it is refused with "
                             "HTTP 503 and Retry-After. Each connection may hold about 3 frames of up to twice "
                             "the frame limit")
    parser.add_argument(f"--{prefix}request-timeout", dest=f"{prefix}request_timeout".replace("-", "_"),
                        type=positive_seconds, default=None,
                        help="seconds before a call is answered with an error and its group cancelled (default: wait)")
    parser.add_argument(f"--{prefix}model-name", dest=f"{prefix}model_name".replace("-", "_"), default=None,
                        help="model name in the openpi metadata (default cosmos3)")


def add_openpi_arguments(parser: argparse.ArgumentParser) -> None:
    """What `serve` and `up` add: --openpi-port (unset: no front), --openpi-host, the defaults."""
    parser.add_argument("--openpi-port", type=port, default=None,
                        help="start the openpi policy websocket on this port (0 = any free port; default off)")
    parser.add_argument("--openpi-host", default=None, help="bind address of the openpi websocket (default: --host)")
    parser.add_argument("--openpi-tokens", metavar="DIR", default=None,
                        help="key directory whose bearer tokens the openpi websocket requires, even on loopback "
                             "(`candidate-scheduler keys DIR --token NAME`; clients send 'Authorization: Bearer "
                             "<token>' or openpi-client's api_key); each call counts against its token's tenant. "
                             "None: --curve-dir when that is set (the scheduler then knows the token names too), "
                             "else no tokens: the websocket is unauthenticated and binds loopback only, unless "
                             "--insecure")
    parser.add_argument("--openpi-allow-nonlocal", action="store_true",
                        help="deprecated: what --insecure now says for the openpi websocket")
    parser.add_argument("--openpi-tls-cert", metavar="FILE", default=None,
                        help="serve the openpi websocket over TLS (wss://) with this PEM certificate chain; needs "
                             "--openpi-tls-key. Off loopback, tokens without TLS cross the network in the clear")
    parser.add_argument("--openpi-tls-key", metavar="FILE", default=None,
                        help="the PEM private key of --openpi-tls-cert (unencrypted)")
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
    for name in ("max-frame-bytes", "max-connections", "request-timeout", "model-name"):
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


def bind_refusal(host: str, tokens: str | None, insecure: bool, tokens_flag: str = "--tokens DIR",
                 insecure_flag: str = "--insecure") -> str | None:
    """Why the websocket may not bind `host` (one line naming the fix), or None: off loopback it needs
    tokens, or the user's explicit `--insecure`."""
    if is_loopback_host(host) or tokens is not None or insecure:
        return None
    return (f"refusing to bind the openpi websocket to {host} without tokens: pass {tokens_flag} "
            "(`candidate-scheduler keys DIR --token NAME` writes one), bind loopback, or pass "
            f"{insecure_flag} to let anyone who reaches it submit work")


def openpi_bind(args: argparse.Namespace) -> tuple[str, str | None, bool]:
    """(host, tokens dir, insecure) of the front `serve` starts; StartupRefused (one line) when it may
    not bind there, or its TLS files cannot serve. `serve` asks before it binds anything, so a refusal
    leaves nothing half started."""
    host = getattr(args, "openpi_host", None) or getattr(args, "host", None) or "127.0.0.1"
    curve_dir = getattr(args, "curve_dir", None)
    tokens = getattr(args, "openpi_tokens", None) or curve_dir
    insecure = bool(getattr(args, "insecure", False) or getattr(args, "openpi_allow_nonlocal", False))
    why = bind_refusal(host, tokens, insecure, "--openpi-tokens DIR (or --curve-dir DIR)")
    cert, key = getattr(args, "openpi_tls_cert", None), getattr(args, "openpi_tls_key", None)
    why = why or pair_refusal(cert, key, "--openpi-tls-cert", "--openpi-tls-key")
    if why is None and cert is not None and getattr(args, "openpi_port", None) is not None:
        try:  # read here too: a bad file is this one line, not a front that exits after serve has bound
            server_context(cert, key)
        except TlsError as exc:
            why = str(exc)
    if why is None and curve_dir is not None and not _same_dir(tokens, curve_dir):
        # the front submits on behalf of the token's holder, whom the scheduler looks up in ITS directory:
        # names from another one are refused there, or land in that directory's tenant of the same name
        why = (f"--openpi-tokens {tokens} is not --curve-dir {curve_dir}: with keys, the scheduler checks each "
               "robot's token holder in its own key directory; give the front that one (leave --openpi-tokens out)")
    if why is not None and getattr(args, "openpi_port", None) is not None:
        from candidate_scheduler.service.server import StartupRefused

        raise StartupRefused(why)
    return host, tokens, insecure


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def spawn_openpi_front(args: argparse.Namespace, bound: dict[str, str], keys: ClientKeys | None = None,
                       timeout_s: float = 60.0, fronts=None) -> tuple[subprocess.Popen | None, str | None]:
    """Start the front (its own process, like the sglang compat bridge) when `args.openpi_port` is set,
    and wait until it listens. Returns (process, "ws://host:port", or wss:// with TLS), or (None, None) when off. Its
    output after the listening line is relayed to this process's stdout. `keys`: the front's CURVE
    pair for the scheduler's sockets (`Scheduler.proxy_keys`), handed over in its environment.
    Tokens: `--openpi-tokens`, else `--curve-dir`; a non-loopback bind without them needs `--insecure`
    (StartupRefused, one line, before anything starts). `fronts`: the FrontWatch
    (service/front_watch.py) that starts it again, on the same port, if it exits while serve runs."""
    if getattr(args, "openpi_port", None) is None:
        return None, None
    from candidate_scheduler.service.front_watch import FrontSpec, start_front

    host, tokens, insecure = openpi_bind(args)
    cmd = [sys.executable, "-m", "candidate_scheduler.service.openpi", "--scheduler-request", bound["request"],
           "--scheduler-control", bound["control"], "--bind", host, "--port", str(args.openpi_port),
           "--no-resubmit"]  # it stops with this scheduler: nothing of it would see the next run
    if tokens is not None:
        cmd += ["--tokens", str(tokens)]
    elif insecure:
        cmd.append("--insecure")
    if getattr(args, "openpi_tls_cert", None) is not None:
        cmd += ["--tls-cert", args.openpi_tls_cert, "--tls-key", args.openpi_tls_key]
    cmd += defaults_argv(args)
    env = None if keys is None else {ENV_KEYS: keys.to_env()}
    spec = FrontSpec("openpi", "the openpi front", cmd, r"listening on (wss?://\S+)", "--port", thread_name="openpi-log",
                     timeout_s=timeout_s, env=env, hint="see its output above")
    return start_front(spec, fronts)


# ---- the front's own command line -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.service.openpi",
                                description="openpi policy websocket in front of candidate_scheduler")
    p.add_argument("--scheduler-request", required=True, help="the scheduler's native request endpoint")
    p.add_argument("--scheduler-control", default=None,
                   help="the scheduler's control endpoint (metadata from STATS; cancels abandoned groups)")
    p.add_argument("--bind", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--tokens", metavar="DIR", default=None,
                   help="require a bearer token of this key directory (its authorized_tokens/) on every "
                        "connection, even on loopback: 'Authorization: Bearer <token>' or openpi-client's "
                        "api_key. Default: no authentication, loopback only")
    p.add_argument("--insecure", action="store_true",
                   help="without --tokens, allow a non-loopback bind address anyway: anyone who reaches it "
                        "can submit work (loud warning)")
    p.add_argument("--allow-nonlocal", dest="insecure", action="store_true",
                   help="deprecated alias of --insecure")
    p.add_argument("--tls-cert", metavar="FILE", default=None,
                   help="serve over TLS (wss://, and https:// for /healthz) with this PEM certificate chain; needs "
                        "--tls-key. Off loopback, tokens without TLS cross the network in the clear")
    p.add_argument("--tls-key", metavar="FILE", default=None, help="the PEM private key of --tls-cert (unencrypted)")
    p.add_argument("--no-resubmit", dest="resubmit", action="store_false",
                   help="answer a call the scheduler did not run because it was stopping with an error, instead "
                        "of sending it to the scheduler's next run (within --request-timeout); `serve "
                        "--openpi-port` starts its front so: that front stops with its scheduler")
    p.add_argument("--log-level", default="WARNING")
    add_default_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from candidate_scheduler.service.openpi.front import (
        DEFAULT_MAX_CONNECTIONS,
        DEFAULT_MAX_FRAME_BYTES,
        READY_PREFIX,
        FrontConfig,
        OpenpiFront,
    )

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from candidate_scheduler.service.keys import KeyDirError, load_tokens

    why = bind_refusal(args.bind, args.tokens, args.insecure) or pair_refusal(args.tls_cert, args.tls_key)
    if why is not None:
        print(f"candidate_scheduler openpi: error: {why}", file=sys.stderr)
        return 2
    tls = None
    if args.tls_cert is not None:
        try:
            tls = server_context(args.tls_cert, args.tls_key)
        except TlsError as exc:
            print(f"candidate_scheduler openpi: error: {exc}", file=sys.stderr)
            return 2
    tokens = keys = None
    try:
        if args.tokens is not None:
            tokens = load_tokens(args.tokens)
    except KeyDirError as exc:
        print(f"candidate_scheduler openpi: error: {exc}", file=sys.stderr)
        return 2
    if os.environ.get(ENV_KEYS):
        try:
            keys = ClientKeys.from_env(os.environ[ENV_KEYS])
        except ValueError:  # never echo it: it holds a secret key
            print(f"candidate_scheduler openpi: error: ${ENV_KEYS} is not 'server_public,public,secret' "
                  "(Z85 keys)", file=sys.stderr)
            return 2
    if tokens is not None and not tokens.by_token:
        print(f"candidate_scheduler openpi: note: no tokens in {args.tokens}/authorized_tokens: every connection "
              f"is refused (`candidate-scheduler keys {args.tokens} --token NAME`, then restart)",
              file=sys.stderr, flush=True)
    if tokens is not None and tls is None and not is_loopback_host(args.bind):
        print(f"candidate_scheduler openpi: {cleartext_token_warning('the openpi websocket', args.bind)}",
              file=sys.stderr, flush=True)
    if tokens is None and not is_loopback_host(args.bind):
        print("!" * 78 + f"\nWARNING: the openpi websocket is bound to NON-LOOPBACK {args.bind} WITHOUT tokens "
              "(--insecure):\nanyone who reaches this port can submit work.\n" + "!" * 78, file=sys.stderr, flush=True)
    try:
        defaults = front_defaults(args)
    except ValueError as exc:
        print(f"bad openpi default: {exc}", file=sys.stderr)
        return 2
    config = FrontConfig(
        scheduler_request=args.scheduler_request, scheduler_control=args.scheduler_control, host=args.bind,
        port=args.port, defaults=defaults, model_name=args.model_name or "cosmos3",
        max_frame_bytes=args.max_frame_bytes or DEFAULT_MAX_FRAME_BYTES,
        max_connections=args.max_connections or DEFAULT_MAX_CONNECTIONS, request_timeout_s=args.request_timeout,
        tokens=tokens, keys=keys, resubmit=args.resubmit, insecure=args.insecure, tls=tls,
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
