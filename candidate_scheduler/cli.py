"""`candidate-scheduler` command line: serve | worker | up | demo | submit | cancel | status | stats |
drain | shutdown | worker-leave | make-checkpoint | keys | bench | http. Every flag says what it does and its default
(`candidate-scheduler SUBCOMMAND --help`); commands.py does the work."""

from __future__ import annotations

import argparse
import logging
import sys

from candidate_scheduler import commands
from candidate_scheduler.arg_types import (
    call_rows,
    dial_endpoint,
    grace_seconds,
    margin_quantile,
    not_negative,
    port,
    positive_int,
    positive_seconds,
    principal_name,
    tenant_limit,
    tenant_name,
    tenant_weight,
    worker_id,
)
from candidate_scheduler.compat.header_timeout import DEFAULT_HEADER_TIMEOUT_S
from candidate_scheduler.core.access import DEFAULT_TENANT, Role
from candidate_scheduler.service import server
from candidate_scheduler.service.endpoints import tcp_endpoint
from candidate_scheduler.service.keys import KeyDirError
from candidate_scheduler.service.server import StartupRefused

DEFAULT_MODEL = commands.DEFAULT_MODEL


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default; descriptions keep their line breaks."""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _fixed_port(text: str) -> int:
    """A port a client dials (demo): 0 would bind one the client never learns."""
    value = port(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a port in 1-65535 (0, any free port, is not one the client can dial)")
    return value


def _metrics_port(text: str) -> int:
    return -1 if _whole(text) == -1 else port(text)


def _demo_metrics_port(text: str) -> int:
    """The demo prints the address it asked for: 0 (any free port) would print one nothing listens on."""
    return -1 if _whole(text) == -1 else _fixed_port(text)


def _not_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return value


def _shapes(text: str) -> str:
    """`worker --warmup-shapes`: parsed as the worker will, so a typo is refused here, not after the model
    loads (`up` checks its own in commands.py, on the local path only: `up --ray` hands it on untouched)."""
    try:
        return commands.check_warmup_shapes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lead_seconds(text: str) -> float:
    """--prefetch-lead: >= 0 seconds, inf meaning at once."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (inf: at once), not {text}")
    return value


def _add_scheduler_args(p: argparse.ArgumentParser) -> None:
    from candidate_scheduler.service.openpi.launch import add_openpi_arguments

    p.add_argument("--host", default=server.DEFAULT_HOST,
                   help="bind address of every socket; off loopback it requires --curve-dir (or --insecure)")
    p.add_argument("--request-port", type=port, default=server.DEFAULT_REQUEST_PORT, help="native request socket (0 = any free port)")
    p.add_argument("--control-port", type=port, default=server.DEFAULT_CONTROL_PORT, help="control socket (0 = any free port)")
    p.add_argument("--worker-port", type=port, default=server.DEFAULT_WORKER_PORT, help="worker link (0 = any free port)")
    p.add_argument("--worker-host", default=None, help="bind address of the worker link (None: --host); "
                   "a non-loopback address requires --curve-dir")
    p.add_argument("--compat-port", type=port, default=server.DEFAULT_COMPAT_PORT, help="sglang-compatible socket")
    p.add_argument("--no-compat", action="store_true", help="do not start the sglang-compatible bridge")
    p.add_argument("--compat-host", default=None, help="bind address of the sglang-compatible socket (default 127.0.0.1, "
                   "whatever --host is: it speaks pickle and takes no keys)")
    p.add_argument("--compat-allow-nonlocal", action="store_true",
                   help="let the sglang-compatible socket bind a non-loopback address (it speaks pickle: think twice)")
    p.add_argument("--metrics-port", type=_metrics_port, default=9464, help="Prometheus /metrics port (0 = any free port; -1 = off)")
    p.add_argument("--metrics-host", default=server.DEFAULT_HOST,
                   help="bind address of /metrics, which has no authentication: not --host, so that opening the "
                        "request socket to robots does not open /metrics to them")
    p.add_argument("--policy", default="microbatch", choices=["microbatch", "sequential", "reject"],
                   help="what to do with a group larger than a physical batch")
    p.add_argument("--batching", default="dispatch", choices=["dispatch", "step"],
                   help="step: groups join and leave a worker's running batch at denoise-step boundaries; "
                        "dispatch: a worker runs one batch from its first step to its last")
    p.add_argument("--max-queued-groups", type=positive_int, default=1024, help="groups in flight before answering 'overloaded'")
    p.add_argument("--prefetch", type=int, default=1, choices=range(0, 5), metavar="{0..4}",
                   help="batches' worth of work a busy worker may hold beyond what it runs (its next dispatch "
                        "batch; rows beyond its capacity under step batching): it starts at the worker's first "
                        "step boundary with room instead of a round trip later; 0: send only what can start")
    p.add_argument("--prefetch-lead", type=_lead_seconds, default=0.01, metavar="SECONDS",
                   help="send prefetched work this long before the worker is predicted to need it (plus its "
                        "conditioning, and a margin learned from batches that ended with nothing to start), not "
                        "as soon as it has room: until then a group that arrives, another tenant's or one due "
                        "sooner, can still go ahead of it; inf: at once")
    p.add_argument("--retry-limit", type=positive_int, default=3, help="attempts per slice before the group fails")
    p.add_argument("--stop-grace-s", type=grace_seconds, default=25.0,
                   help="on SIGTERM, admit no new groups and serve the ones admitted for up to this long before "
                        "stopping; what is left then is answered shutting_down (0: stop at once, as SIGINT does). "
                        "Keep it below your orchestrator's kill timeout (Kubernetes: terminationGracePeriodSeconds)")
    p.add_argument("--heartbeat-interval", type=positive_seconds, default=0.5, help="seconds between worker heartbeats")
    p.add_argument("--heartbeat-timeout", type=positive_seconds, default=3.0, help="seconds without a heartbeat before a worker is dead")
    p.add_argument("--best-effort-slack", type=not_negative, default=30.0,
                   help="seconds: a group without a deadline is ordered as if due this long after receipt, so "
                        "earliest-deadline-first never starves it")
    p.add_argument("--deadline-margin-quantile", type=margin_quantile, default=0.9,
                   help="the percentile (0.5-1) of each worker's measured actual/predicted time that deadline "
                        "forecasts plan for: higher misses fewer deadlines, serves fewer elastic candidates and "
                        "refuses more")
    p.add_argument("--curve-dir", default=None,
                   help="the key directory (`candidate-scheduler keys`): every native socket then takes only "
                        "authorised CURVE keys, whose role and tenant it names")
    p.add_argument("--insecure", action="store_true",
                   help="let sockets listen off loopback WITHOUT keys: anyone who reaches them may do anything "
                        "(warned at start and shown in stats)")
    p.add_argument("--tenant-limit", type=tenant_limit, action="append", default=[], metavar="TENANT=N",
                   help="groups in flight a tenant may have (repeat per tenant); over it: 'overloaded'")
    p.add_argument("--tenant-weight", type=tenant_weight, action="append", default=[], metavar="TENANT=W",
                   help="a tenant's share under fair queueing, relative to 1 (repeat per tenant): W=2 gets twice "
                        "the work of a tenant of weight 1 when both wait")
    p.add_argument("--no-fair-queueing", action="store_true",
                   help="order groups without a deadline by receipt across tenants (default: fair shares, so one "
                        "tenant's flood holds another's group back by about a batch)")
    p.add_argument("--no-stagger", action="store_true",
                   help="dispatch batching: start workers' next batches at their boundaries behind a deep backlog "
                        "(default: a worker whose batch would end with another's waits a little, so boundaries "
                        "spread over the batch and a group arriving behind the backlog waits about a batch over "
                        "the workers for one, not a whole batch)")
    add_openpi_arguments(p)


def _add_worker_args(p: argparse.ArgumentParser, with_scheduler: bool) -> None:
    if with_scheduler:
        p.add_argument("--scheduler", type=dial_endpoint,
                       default=tcp_endpoint(server.DEFAULT_HOST, server.DEFAULT_WORKER_PORT),
                       help="the scheduler's worker link")
        p.add_argument("--worker-id", type=worker_id, default=None, help="this worker's id (None: host-pid-random)")
        p.add_argument("--step-delay", type=not_negative, default=0.0, help="test knob: sleep this long before each denoise step")
        p.add_argument("--curve-dir", default=None, help="CURVE keys (worker.key_secret, server.key) for a remote scheduler")
        p.add_argument("--leave-grace-s", type=grace_seconds, default=25.0,
                       help="on SIGTERM, take no new work and finish what the worker holds for up to this long "
                            "before going; what is left then is retried elsewhere (0: go at once). Keep it below "
                            "your orchestrator's kill timeout (Kubernetes: terminationGracePeriodSeconds)")
        p.add_argument("--fault", default=None, metavar="SPEC",
                       help="test knob: inject worker faults, e.g. malformed:0.3,raise:0.1,seed=7 (worker/faults.py)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="Cosmos3 checkpoint directory")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--capacity", type=positive_int, default=None, help="candidate rows a worker holds at once (None: the model's)")
    p.add_argument("--adapter", default="cosmos3", choices=["cosmos3", "null"],
                   help="cosmos3 (the product) or null (a model-free adapter for tests and benchmarks)")
    p.add_argument("--conditioning-cache-mb", type=not_negative, default=256.0,
                   help="worker cache of text K/V and observation latents reused across groups (0 = off)")
    p.add_argument("--warmup-shapes", type=_shapes if with_scheduler else str, default="64x64",
                   help="HxW shapes the worker times before registering: the scheduler's first cost model ('' = none)")
    p.add_argument("--memory-budget-mb", type=not_negative, default=0.0,
                   help="device memory a worker may use; caps its rows by the predicted peak per row (0 = no cap)")
    p.add_argument("--call-rows", default="auto", type=call_rows,
                   help="the most candidate rows one transformer call carries: auto (1 on CUDA, where batched "
                        "calls are not bitwise sglang's alone; all on the CPU, where they are), all, or N")
    p.add_argument("--conditioning", default="thread", choices=["thread", "inline"],
                   help="thread: groups that arrive while others run are conditioned (VAE encode, text pathway) on "
                        "their own thread while the running batch keeps stepping; inline: on the compute thread, "
                        "between two steps")


def _add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=server.DEFAULT_HOST, help="the scheduler's host")
    p.add_argument("--request-port", type=_fixed_port, default=server.DEFAULT_REQUEST_PORT, help="its request socket")
    p.add_argument("--control-port", type=_fixed_port, default=server.DEFAULT_CONTROL_PORT, help="its control socket")
    p.add_argument("--curve-dir", default=None, help="a directory holding server.key and KEY.key_secret, for a "
                   "scheduler that takes keys (see `candidate-scheduler keys`)")
    p.add_argument("--key", default="admin", help="the name of this client's key pair in --curve-dir")


def _add_submit_args(p: argparse.ArgumentParser) -> None:
    _add_client_args(p)
    p.add_argument("--count", type=int, default=1, help="candidates in the group")
    p.add_argument("--min-count", type=int, default=None,
                   help="elastic count: under --deadline serve at least this many (None: exactly --count)")
    p.add_argument("--reducer", default="mean", help="mean | median | medoid | none (none with --rollout)")
    p.add_argument("--seed", type=int, default=42, help="base seed")
    p.add_argument("--seed-policy", default="per_candidate", choices=["per_candidate", "offset"],
                   help="how candidate seeds derive from --seed")
    p.add_argument("--seeds", type=_ints, default=None, metavar="S1,S2,...",
                   help="explicit candidate seeds (sets the count and the explicit policy)")
    p.add_argument("--request-id", default=None, help="the group's id (None: a random one)")
    p.add_argument("--prompt", default="pick up the red cube", help="the instruction")
    p.add_argument("--height", type=int, default=64, help="conditioning height (multiple of 16)")
    p.add_argument("--width", type=int, default=64, help="conditioning width (multiple of 16)")
    p.add_argument("--steps", type=int, default=4, help="denoising steps")
    p.add_argument("--horizon", type=int, default=16, help="action horizon (multiple of 4)")
    p.add_argument("--guidance", type=float, default=1.0, help="classifier-free guidance scale (> 1 turns CFG on)")
    p.add_argument("--domain-id", type=int, default=None, help="embodiment domain id (None: from --domain-name, or 0)")
    p.add_argument("--domain-name", default=None, help="an sglang embodiment, e.g. droid_lerobot (resolved as sglang does)")
    p.add_argument("--raw-action-dim", type=int, default=None,
                   help="action dims (None: from --domain-name, or 7)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from receipt: refused at once when predicted unmeetable, expired if it passes")
    p.add_argument("--return-candidates", action="store_true", help="also return every candidate")
    p.add_argument("--rollout", action="store_true", help="RL rollout: flow-SDE trajectories and per-step log-probs")
    p.add_argument("--noise-level", type=float, default=0.7, help="rollout: SDE noise level")
    p.add_argument("--return-step-indices", type=_ints, default=None, metavar="I,J,...",
                   help="rollout: the steps to return (None: every step)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--image", action="append", default=None, metavar="PATH",
                   help="an RGB image file; repeat for B observations (one reduced action each)")
    g.add_argument("--synthetic", action="store_true", help="a deterministic synthetic observation (what no --image means)")
    p.add_argument("--image-seed", type=int, default=0, help="seed of the synthetic observation")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the reply")
    p.add_argument("--json", action="store_true", help="one-line JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="candidate-scheduler", description=__doc__, formatter_class=_Help)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, fn, **kwargs) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Help, **kwargs)
        p.set_defaults(fn=fn)
        return p

    _add_scheduler_args(command("serve", "run the scheduler process", commands.cmd_serve))

    _add_worker_args(command("worker", "run a worker process", commands.cmd_worker), True)

    # no abbreviated flags: `up --ray` hands its own command line on to `serve` and the workers
    # (service/ray_placement.serve_argv), where `--call` for `--call-rows` is an unknown flag
    p = command("up", "a scheduler and N local workers", commands.cmd_up, allow_abbrev=False)
    _add_scheduler_args(p)
    _add_worker_args(p, False)
    p.add_argument("--workers", type=_not_negative_int, default=1, help="local workers to start")
    r = p.add_argument_group("Ray (pip install candidate-scheduler[ray]; docs/deployment.md)")
    r.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="place the scheduler and the workers as Ray actors on this cluster ('auto': the one "
                        "`ray start` made; 'local': a new one on this machine) instead of starting them here")
    r.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs Ray gives each worker (with --ray)")
    r.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs Ray gives each worker (with --ray)")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="times a worker that dies (a crash, not a leave: exit 0) is started again, -1: no limit; "
                        "with --ray, times Ray restarts a dead worker or scheduler")
    r.add_argument("--placement", default="SPREAD", choices=["SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"],
                   help="the placement group's strategy (with --ray)")

    p = command("demo", "start everything on the tiny checkpoint and send one group (make run)", commands.cmd_demo)
    p.add_argument("--model", default=DEFAULT_MODEL, help="Cosmos3 checkpoint directory (written if missing)")
    p.add_argument("--count", type=positive_int, default=8, help="candidates in the demo group")
    p.add_argument("--once", action="store_true", help="exit after the demo group instead of serving on")
    p.add_argument("--no-compat", action="store_true", help="do not start the sglang-compatible bridge")
    p.add_argument("--request-port", type=_fixed_port, default=server.DEFAULT_REQUEST_PORT, help="native request socket")
    p.add_argument("--control-port", type=_fixed_port, default=server.DEFAULT_CONTROL_PORT, help="control socket")
    p.add_argument("--worker-port", type=_fixed_port, default=server.DEFAULT_WORKER_PORT, help="worker link")
    p.add_argument("--compat-port", type=_fixed_port, default=server.DEFAULT_COMPAT_PORT, help="sglang-compatible socket")
    p.add_argument("--metrics-port", type=_demo_metrics_port, default=9464, help="Prometheus /metrics port (-1 = off)")

    _add_submit_args(command("submit", "send one candidate group and print the JSON reply", commands.cmd_submit))

    for name, needs_id in (("cancel", True), ("status", True), ("stats", False), ("drain", False), ("shutdown", False)):
        p = command(name, f"control: {name}", commands.cmd_control)
        _add_client_args(p)
        if needs_id:
            p.add_argument("request_id", help="the group's request id")
            p.add_argument("--principal", default=None,
                           help="whose request id it is, when not yours: with a key directory each principal's "
                                "ids are its own, and an admin names the one it means (default: your own)")
    p = command("worker-leave", "control: ask one worker to leave: no new work, it finishes what it holds (within "
                "its --leave-grace-s) and goes, as on SIGTERM (admin)", commands.cmd_control)
    _add_client_args(p)
    p.add_argument("worker_id", help="the worker's id (`stats` lists them)")

    p = command("make-checkpoint", "write a random-weight Cosmos3 checkpoint (tiny by default; no download)",
                commands.cmd_make_checkpoint)
    from candidate_scheduler.worker.tiny_checkpoint import add_make_checkpoint_arguments

    add_make_checkpoint_arguments(p)

    p = command("keys", "write the key directory: the scheduler's, a worker's and an admin's CURVE pairs (if "
                "missing), and named client keys and tokens", commands.cmd_keys)
    p.add_argument("dir", help="the key directory (docs/deployment.md: what each file is, and whom to give it)")
    p.add_argument("--client", action="append", metavar="NAME", type=principal_name,
                   help="add a CURVE pair for NAME (repeatable)")
    p.add_argument("--token", action="append", metavar="NAME", type=principal_name,
                   help="add a bearer token for NAME, for the openpi websocket and the HTTP server (repeatable)")
    p.add_argument("--role", default="client", choices=[r.value for r in Role],
                   help="what the new keys or tokens may do: client (its own groups), proxy (a front acting for "
                        "clients it authenticates), admin (everything), worker (the worker link only)")
    p.add_argument("--tenant", default=DEFAULT_TENANT, type=tenant_name,
                   help="whose limits and fair share the new keys or tokens count against")

    p = command("bench", "run the benchmarks (writes bench/results/); `bench -- --help` lists their flags",
                commands.cmd_bench)
    p.add_argument("bench_args", nargs=argparse.REMAINDER,
                   help="flags of python -m candidate_scheduler.bench: --smoke, --load, --no-load, --model, --out, ...")

    p = command("http", "sglang's own HTTP server pointed at this scheduler's compat socket", commands.cmd_http)
    p.add_argument("--compat-port", type=_fixed_port, default=server.DEFAULT_COMPAT_PORT, help="the compat socket's port")
    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint whose configs sglang's server reads")
    p.add_argument("--http-host", default="127.0.0.1",
                   help="HTTP bind address; off loopback it requires --tokens (or --insecure)")
    p.add_argument("--http-port", type=port, default=30000, help="HTTP port")
    p.add_argument("--tokens", metavar="DIR", default=None,
                   help="require a bearer token of this key directory (its authorized_tokens/; `candidate-scheduler "
                        "keys DIR --token NAME`) on every route but GET /liveness and /health, even on loopback: "
                        "'Authorization: Bearer <token>'. The compat bridge is one principal for all HTTP clients, "
                        "so the bridge's tenant applies, not the token's. None: no authentication, loopback only")
    p.add_argument("--insecure", action="store_true",
                   help="without --tokens, allow a non-loopback --http-host anyway: anyone who reaches it can "
                        "submit work (loud warning)")
    p.add_argument("--header-timeout", type=positive_seconds, default=DEFAULT_HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="close a connection that has not sent a request's whole head (request line and headers) "
                        "this long after it opened or after its last response (slowloris)")
    p.add_argument("--tls-cert", metavar="FILE", default=None,
                   help="serve https:// (and wss://) only, with this PEM certificate chain; needs --tls-key. Off "
                        "loopback, tokens without TLS cross the network in the clear")
    p.add_argument("--tls-key", metavar="FILE", default=None, help="the PEM private key of --tls-cert (unencrypted)")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv[:1] == ["bench"] and argv[1:] not in (["-h"], ["--help"]):
        # argparse's REMAINDER refuses a remainder that starts with a flag (`bench --smoke`), so the
        # benchmark's own flags are handed over untouched; `bench --help` still goes to our parser.
        return int(commands.cmd_bench(argparse.Namespace(bench_args=argv[1:])) or 0)
    args = parser.parse_args(argv)
    args.argv = argv  # `up --ray` hands the scheduler's own flags on to `serve`
    try:
        return int(args.fn(args) or 0)
    except (StartupRefused, KeyDirError) as exc:  # a configuration the user can fix: one line, no traceback
        print(f"candidate-scheduler {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
