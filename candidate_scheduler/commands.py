"""What each `candidate-scheduler` subcommand does (cli.py parses the flags and calls one of these)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

from candidate_scheduler.gc_tuning import tune_gc
from candidate_scheduler.service import server
from candidate_scheduler.service.endpoints import tcp_endpoint
from candidate_scheduler.service.keys import ENV_KEYS, OPENPI_FRONT, SGLANG_BRIDGE

DEFAULT_MODEL = ".cache/tiny-cosmos3"


def _config(args) -> server.SchedulerConfig:
    try:
        engine = _engine_config(args)
    except ValueError as exc:  # flags that parse alone but not together: one line (cli.main), not a traceback
        raise server.StartupRefused(str(exc)) from None
    return server.SchedulerConfig(
        request_endpoint=tcp_endpoint(args.host, args.request_port),
        control_endpoint=tcp_endpoint(args.host, args.control_port),
        worker_endpoint=tcp_endpoint(args.worker_host or args.host, args.worker_port),
        metrics_host=args.metrics_host,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        curve_dir=args.curve_dir,
        insecure=args.insecure,
        engine=engine,
    )


def _engine_config(args):
    from candidate_scheduler.arg_types import tenant_policies
    from candidate_scheduler.core.admission import AdmissionPolicy
    from candidate_scheduler.core.engine import EngineConfig

    return EngineConfig(policy=AdmissionPolicy(args.policy), batching=args.batching,
                        max_queued_groups=args.max_queued_groups, retry_limit=args.retry_limit,
                        best_effort_s=args.best_effort_slack, heartbeat_interval_s=args.heartbeat_interval,
                        heartbeat_timeout_s=args.heartbeat_timeout,
                        margin_quantile=args.deadline_margin_quantile, prefetch=args.prefetch,
                        prefetch_lead_s=args.prefetch_lead,
                        tenants=tenant_policies(args.tenant_limit, args.tenant_weight),
                        fair_queueing=not args.no_fair_queueing, stagger=not args.no_stagger)


def _start_metrics(config: server.SchedulerConfig, tenants: list[str]):
    if config.metrics_port is None:
        return None, None
    from candidate_scheduler.service import metrics
    from candidate_scheduler.service.endpoints import is_loopback_host

    if not is_loopback_host(config.metrics_host):
        # /metrics has no authentication of its own: it is opened off loopback only when asked by name
        print(f"candidate-scheduler: note: /metrics is served on {config.metrics_host} without authentication "
              "(--metrics-host); keep it to your monitoring network", file=sys.stderr, flush=True)
    m = metrics.SchedulerMetrics(tenants=tenants)
    try:
        _server, _thread, port = metrics.start_http_server(m, config.metrics_host, config.metrics_port)
    except OSError as exc:  # a port in use, an address not on this host: the user's to fix, in one line
        raise server.StartupRefused(f"cannot serve /metrics on {config.metrics_host}:{config.metrics_port}: "
                                    f"{exc.strerror or exc} (--metrics-port, --metrics-host; -1: off)") from exc
    return m, f"http://{config.metrics_host}:{port}/metrics"


def _spawn_bridge(args, bound: dict[str, str], keys, fronts=None) -> tuple[subprocess.Popen | None, str | None]:
    """Start the sglang compat bridge (its own process: it never shares a process with the scheduler's
    state) and wait until it listens, so sglang's 2 s ping never meets a half-started bridge. `fronts`:
    the FrontWatch that starts it again if it exits while serve runs."""
    if args.no_compat:
        return None, None
    from candidate_scheduler.service.front_watch import FrontSpec, start_front

    endpoint = tcp_endpoint(args.compat_host or server.DEFAULT_HOST, args.compat_port)
    cmd = [sys.executable, "-m", "candidate_scheduler.compat.bridge", "--bind", endpoint,
           "--scheduler", bound["request"], "--control", bound["control"]]
    if args.compat_allow_nonlocal or args.insecure:  # what _serve let through: else the bridge refused its bind
        cmd.append("--allow-nonlocal")
    env = None if keys is None else {ENV_KEYS: keys.to_env()}
    spec = FrontSpec("compat", "the sglang compat bridge", cmd, r"listening on (\S+)", "--bind",
                     thread_name="bridge-log", timeout_s=60, env=env, hint="use --no-compat to run without it")
    return start_front(spec, fronts)


def _serve(args, on_ready=None) -> None:
    from candidate_scheduler.service.endpoints import is_loopback_host
    from candidate_scheduler.service.front_watch import FrontWatch
    from candidate_scheduler.service.openpi.launch import openpi_bind, spawn_openpi_front

    config = _config(args)
    # a front that may not bind where asked refuses the start before anything binds
    openpi_bind(args)
    compat_host = args.compat_host or server.DEFAULT_HOST
    if not args.no_compat and not is_loopback_host(compat_host) and not (args.insecure or args.compat_allow_nonlocal):
        raise server.StartupRefused(
            f"refusing to bind the sglang compat socket on {compat_host}: it speaks pickle and takes no keys; keep "
            "it on loopback (remote sglang users: `candidate-scheduler http --tokens`), pass --no-compat, or "
            "--insecure to let anyone who reaches it submit")
    scheduler = server.Scheduler(config)
    bound = scheduler.bind()
    if not args.no_compat:
        scheduler.note_compat(compat_host)
    tenants = sorted({*scheduler.tenant_names(), *(t.name for t in config.engine.tenants)})
    metrics, metrics_url = _start_metrics(config, tenants)
    scheduler.use_metrics(metrics)
    if scheduler.insecure_sockets:
        print("!" * 78 + f"\nWARNING: --insecure: the {', '.join(scheduler.insecure_sockets)} socket(s) listen off "
              "loopback WITHOUT authentication.\nAnyone who reaches them can submit, cancel any group, make workers "
              "leave, drain and shut the scheduler down.\n" + "!" * 78, file=sys.stderr, flush=True)
    print(f"candidate-scheduler: request endpoint  {bound['request']}", flush=True)
    print(f"candidate-scheduler: control endpoint  {bound['control']}", flush=True)
    print(f"candidate-scheduler: worker link       {bound['worker']}", flush=True)
    print(f"candidate-scheduler: metrics           {metrics_url or 'off'}", flush=True)

    # a front that exits while serve runs is started again on its port (service/front_watch.py); not once
    # serve stops: a SHUTDOWN ends the loop, a signal holds the watch before anything else
    fronts = FrontWatch(metrics=metrics, serving=lambda: not (scheduler.stop_now.is_set() or scheduler.engine.stopping))

    def on_sigint(*_):
        fronts.hold()
        scheduler.stop_now.set()

    def on_sigterm(*_):
        fronts.hold()
        scheduler.stop(args.stop_grace_s)

    try:
        # SIGTERM (Kubernetes, systemd): serve what was admitted, then stop (docs/deployment.md); SIGINT
        # (Ctrl-C) or a second SIGTERM stops at once. Set before the fronts start, so a signal while they
        # do is taken up by the loop's first pass, and the `finally` below stops them
        signal.signal(signal.SIGINT, on_sigint)
        signal.signal(signal.SIGTERM, on_sigterm)
        front_keys = scheduler.proxy_keys(OPENPI_FRONT) if args.openpi_port is not None else None
        _openpi, openpi_url = spawn_openpi_front(args, bound, keys=front_keys, fronts=fronts)
        print(f"candidate-scheduler: openpi policy     {openpi_url or 'off'}", flush=True)
        _bridge, compat = _spawn_bridge(args, bound, None if args.no_compat else scheduler.proxy_keys(SGLANG_BRIDGE),
                                        fronts)
        # printed last: launchers wait for this line
        print(f"candidate-scheduler: sglang compat     {compat or 'off'}", flush=True)
        fronts.start()
        if on_ready is not None:
            on_ready(scheduler, bound)
        tune_gc()
        scheduler.serve()
    finally:
        fronts.stop()


def cmd_serve(args) -> int:
    _serve(args)
    return 0


def _worker_cmd(args, endpoint: str) -> list[str]:
    return [sys.executable, "-m", "candidate_scheduler.cli", "worker", "--scheduler", endpoint, *worker_flags(args)]


def worker_flags(args) -> list[str]:
    """The `worker` flags `up` gives each worker it starts (all but --scheduler and --worker-id)."""
    cmd = ["--adapter", args.adapter, "--device", args.device]
    if args.model:
        cmd += ["--model", args.model]
    if args.capacity:
        cmd += ["--capacity", str(args.capacity)]
    cmd += ["--warmup-shapes", args.warmup_shapes, "--conditioning-cache-mb", str(args.conditioning_cache_mb),
            "--memory-budget-mb", str(args.memory_budget_mb), "--conditioning", args.conditioning,
            "--call-rows", args.call_rows]
    if getattr(args, "curve_dir", None):
        cmd += ["--curve-dir", args.curve_dir]  # a CURVE-protected link refuses keyless local workers too
    return cmd


def cmd_up(args) -> int:
    """A scheduler plus N local workers in one command (the demo layout); with --ray, placed on a Ray
    cluster (service/ray_placement.py)."""
    if args.ray is not None:
        try:
            from candidate_scheduler.service.ray_placement import run_up
        except ModuleNotFoundError as exc:  # one line that says the fix, not a traceback
            if exc.name != "ray" and not (exc.name or "").startswith("ray."):
                raise
            raise server.StartupRefused("--ray needs Ray: pip install 'candidate-scheduler[ray]'") from exc
        return run_up(args, worker_flags(args))
    import socket

    from candidate_scheduler.service.supervisor import WorkerSupervisor

    if args.workers:
        _check_worker_inputs(args)  # before the scheduler binds: else it serves on with workers that died at start
    supervisor = None

    def on_ready(_scheduler, bound):
        nonlocal supervisor
        # each under an id of its own that its restarts keep: the scheduler takes a restarted worker for the
        # same one and retries what the dead process held at once (service/supervisor.py)
        host = socket.gethostname()
        cmds = [[*_worker_cmd(args, bound["worker"]), "--worker-id", f"{host}-up{i}"] for i in range(args.workers)]
        supervisor = WorkerSupervisor(cmds, max_restarts=args.max_restarts,
                                      say=lambda line: print(line, flush=True))
        # tied: an `up` killed outright (SIGKILL, OOM) takes its workers with it, instead of leaving them
        # dialling a scheduler that is gone (on_ready runs on the main thread: see die_with_parent)
        supervisor.start(lambda i, proc: print(f"candidate-scheduler: worker {i} pid {proc.pid} ({args.adapter}, "
                                               f"{args.device})", flush=True))

    try:
        _serve(args, on_ready)
    finally:
        if supervisor is not None:
            supervisor.stop()
    return 0


def check_warmup_shapes(text: str) -> str:
    """ValueError unless `text` is what worker/profile.py's parse_shapes reads: HxW[,HxW...]."""
    from candidate_scheduler.worker.profile import parse_shapes

    try:
        shapes = parse_shapes(text)
    except ValueError:
        raise ValueError(f"expected HxW[,HxW...], e.g. 64x64,256x256, not {text!r}") from None
    if any(h < 1 or w < 1 for h, w in shapes):
        raise ValueError(f"every shape must be at least 1x1, not {text!r}")
    return text


def _check_worker_inputs(args) -> None:
    """What a worker would otherwise find only after loading the model and warming up (a minute on a
    large checkpoint), as a traceback from deep inside sglang or pyzmq: refused first, in one line."""
    if args.adapter == "cosmos3" and args.model and not Path(args.model).is_dir():
        raise server.StartupRefused(f"--model {args.model} is not a checkpoint directory (`candidate-scheduler "
                                    f"make-checkpoint {args.model}` writes a tiny random-weight one)")
    try:
        check_warmup_shapes(args.warmup_shapes)
    except ValueError as exc:
        raise server.StartupRefused(f"--warmup-shapes: {exc}") from None
    if getattr(args, "curve_dir", None) and hasattr(args, "scheduler"):
        from candidate_scheduler.service.keys import ClientKeys, worker_key_name

        ClientKeys.load(args.curve_dir, worker_key_name(args.curve_dir))  # as worker/link.py; KeyDirError: one line


def cmd_worker(args) -> int:
    from candidate_scheduler.worker.loop import Worker, build_adapter

    _check_worker_inputs(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    adapter = build_adapter(args.adapter, args.model, args.device, args.capacity, args.conditioning_cache_mb,
                            args.call_rows)
    if hasattr(adapter, "call_rows"):  # what decides exactness on CUDA: say it where the operator looks
        logging.getLogger(__name__).info("transformer calls carry %s candidate rows at most (--call-rows %s on %s)",
                                         adapter.call_rows or "all", args.call_rows, args.device)
    if getattr(args, "fault", None):
        from candidate_scheduler.worker.faults import wrap

        adapter = wrap(adapter, args.fault)  # test/drill knob: see worker/faults.py
    from candidate_scheduler.worker.profile import parse_shapes

    worker = Worker(args.scheduler, adapter, capacity=args.capacity, device=args.device,
                    worker_id=args.worker_id, curve_dir=args.curve_dir, step_delay_s=args.step_delay,
                    warmup_shapes=parse_shapes(args.warmup_shapes),
                    memory_budget_bytes=int(args.memory_budget_mb * 2**20), conditioning=args.conditioning,
                    leave_grace_s=args.leave_grace_s)
    # SIGTERM (Kubernetes, systemd): leave gracefully (docs/deployment.md); a second one stops at once
    signal.signal(signal.SIGTERM, lambda *_: worker.leave())
    # SIGINT stops it at once (a terminal's Ctrl-C reaches `up`'s workers too), in one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: worker.interrupt())
    try:
        print(f"candidate-scheduler worker {worker.worker_id}: connecting to {args.scheduler}", flush=True)
        worker.serve()
    except KeyboardInterrupt:  # raised by interrupt() only before the sockets open
        pass
    if worker.interrupted:
        print(f"candidate-scheduler worker {worker.worker_id}: stopped (SIGINT)", flush=True)
        return 130
    if worker.left_reason is not None:
        print(f"candidate-scheduler worker {worker.worker_id}: left ({worker.left_reason})", flush=True)
    return 0


def _client(args):
    from candidate_scheduler.service.client import Client
    from candidate_scheduler.service.keys import ClientKeys

    host = getattr(args, "host", server.DEFAULT_HOST)
    keys = ClientKeys.load(args.curve_dir, args.key) if getattr(args, "curve_dir", None) else None
    return Client(tcp_endpoint(host, args.request_port), tcp_endpoint(host, args.control_port), keys=keys)


def _observations(args):
    import numpy as np

    from candidate_scheduler.service.client import synthetic_image

    if not args.image:
        return synthetic_image(args.height, args.width, seed=args.image_seed)
    from PIL import Image

    images = [np.asarray(Image.open(path).convert("RGB"), dtype=np.uint8) for path in args.image]
    if len(images) == 1:
        return images[0]
    if len({im.shape for im in images}) != 1:
        raise SystemExit(f"every --image must have the same size, got {sorted({im.shape for im in images})}")
    return np.stack(images)  # B observations: one reduced action each


def cmd_submit(args) -> int:
    from candidate_scheduler.service.client import make_request

    sampling = dict(height=args.height, width=args.width, steps=args.steps, horizon=args.horizon,
                    guidance_scale=args.guidance, domain_id=args.domain_id, domain_name=args.domain_name,
                    raw_action_dim=args.raw_action_dim)
    if args.rollout:
        sampling.update(rollout=True, noise_level=args.noise_level, return_step_indices=args.return_step_indices)
    seeds = args.seeds
    request = make_request(
        _observations(args), args.prompt, request_id=args.request_id, count=len(seeds) if seeds else args.count,
        reducer="none" if args.rollout and args.reducer == "mean" else args.reducer,
        return_candidates=args.return_candidates, seed=args.seed,
        seed_policy="explicit" if seeds else args.seed_policy, seeds=seeds, min_count=args.min_count,
        deadline_s=args.deadline, **sampling,
    )
    from candidate_scheduler.service.client import SchedulerUnavailable

    with _client(args) as client:
        try:
            result = client.wait(client.send(request), timeout_s=args.timeout)
        except TimeoutError as exc:
            print(json.dumps({"request_id": request.request_id, "status": "timeout", "error": str(exc)}))
            return 3
        except SchedulerUnavailable as exc:  # one line; resubmitting the same --request-id is safe
            print(f"candidate-scheduler submit: scheduler unavailable: {exc}", file=sys.stderr)
            return 4
    out = result.to_json()
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0 if result.ok else 1


def cmd_control(args) -> int:
    from candidate_scheduler.service.client import SchedulerUnavailable

    try:
        return _control(args)
    except (TimeoutError, SchedulerUnavailable) as exc:  # no scheduler there: one line, as `submit` says it
        print(f"candidate-scheduler {args.command}: scheduler unavailable at {getattr(args, 'host', server.DEFAULT_HOST)}"
              f" (control port {args.control_port}): {exc}", file=sys.stderr)
        return 4


def _control(args) -> int:
    with _client(args) as client:
        if args.command == "cancel":
            reply = client.cancel(args.request_id, args.principal)
        elif args.command == "status":
            reply = client.status(args.request_id, args.principal)
        elif args.command == "drain":
            reply = client.drain()
        elif args.command == "shutdown":
            reply = client.shutdown()
        elif args.command == "worker-leave":
            reply = client.worker_leave(args.worker_id)
        else:
            print(json.dumps(client.stats(), indent=2))
            return 0
    print(json.dumps({"ok": reply.ok, "changed": reply.changed, "state": reply.state, "detail": reply.detail,
                      "error": reply.error, "error_code": reply.error_code}))
    return 0 if reply.ok else 1


def cmd_make_checkpoint(args) -> int:
    from candidate_scheduler.worker.tiny_checkpoint import run_make_checkpoint

    return run_make_checkpoint(args)


def cmd_keys(args) -> int:
    """Write the key directory (service/keys.py): with no names, the scheduler's, a worker's and an
    admin's CURVE pairs; --client NAME adds a pair, --token NAME a bearer token, each with its role and
    tenant."""
    from candidate_scheduler.service import keys

    d = Path(args.dir)
    for line in keys.init_dir(d):
        print(f"wrote {line}")
    for name in args.client or ():
        secret = keys.add_key(d, name, args.role, args.tenant)
        print(f"wrote {secret} ({args.role}, tenant {args.tenant}); authorised {d}/authorized_clients/{name}.key; "
              f"give {name} {secret.name} and server.key")
    for name in args.token or ():
        keys.add_token(d, name, args.role, args.tenant)
        print(f"wrote {d}/{name}.token ({args.role}, tenant {args.tenant}); authorised its hash in "
              f"{d}/authorized_tokens/{name}.json; give {name} the token")
    return 0


def _demo_checkpoint(model: str, ensure_checkpoint) -> None:
    """Write the tiny checkpoint where `--model` names nothing yet, or an older tiny one of ours. Any other
    directory (a real Cosmos3 checkpoint, a full preset, a user's files) is used as it is: writing replaces
    the directory whole, so that would delete it."""
    from candidate_scheduler.worker.checkpoint_layout import MANIFEST_FILE

    path = Path(model)
    if path.exists() and not path.is_dir():
        raise server.StartupRefused(f"--model {model} is a file, not a checkpoint directory")
    if not path.exists() or not any(path.iterdir()):
        ensure_checkpoint(path)
        return
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return  # not written by make-checkpoint: not ours to replace
    if isinstance(manifest, dict) and manifest.get("preset", "tiny") == "tiny" and not manifest.get("config_only"):
        ensure_checkpoint(path)


def cmd_demo(args) -> int:
    """`make run`: a scheduler and a Cosmos3 worker on the tiny checkpoint, one candidate group."""
    import numpy as np

    from candidate_scheduler.service.client import Client, synthetic_image
    from candidate_scheduler.worker.tiny_checkpoint import ensure_checkpoint

    _demo_checkpoint(args.model, ensure_checkpoint)
    cmd = [sys.executable, "-m", "candidate_scheduler.cli", "up", "--model", args.model, "--workers", "1",
           "--request-port", str(args.request_port), "--control-port", str(args.control_port),
           "--worker-port", str(args.worker_port), "--compat-port", str(args.compat_port),
           "--metrics-port", str(args.metrics_port)]
    if args.no_compat:
        cmd.append("--no-compat")
    print("starting: " + " ".join(cmd), flush=True)
    from candidate_scheduler.service.processes import tied_to_this_process

    # SIGTERM (a CI runner's timeout, `kill`) stops it as Ctrl-C does: the `finally` below stops `up`, which
    # else held the ports for the next `make run`; tied, `up` goes even when this process is SIGKILLed
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    service = subprocess.Popen(cmd, preexec_fn=tied_to_this_process())
    client = Client(tcp_endpoint(server.DEFAULT_HOST, args.request_port), tcp_endpoint(server.DEFAULT_HOST, args.control_port))
    serving = False
    try:
        deadline = time.monotonic() + 180
        print("waiting for the worker to load the model (sglang's import takes ~15 s)...", flush=True)
        while time.monotonic() < deadline:
            if service.poll() is not None:
                print("the service exited early; see the log above", file=sys.stderr)
                return 1
            try:
                if client.stats()["workers"]:
                    break
            except TimeoutError:
                pass
            time.sleep(0.5)
        else:
            print("no worker registered within 180 s", file=sys.stderr)
            return 1
        image = synthetic_image(64, 64)
        t0 = time.perf_counter()
        result = client.submit(image, "pick up the red cube", count=args.count, reducer="mean",
                               return_candidates=True, seed=7, timeout_s=120)
        elapsed = time.perf_counter() - t0
        np.set_printoptions(precision=3, suppress=True, linewidth=120)
        print()
        print(f"group {result.request_id}: status={result.status} in {elapsed * 1000:.0f} ms")
        if result.ok:
            print(f"  candidates: {result.candidates.shape[0]} x {list(result.candidates.shape[1:])} "
                  f"(seeds {result.candidate_seeds})")
            print(f"  reduced action (mean), first 3 of {result.action.shape[0]} steps:\n{result.action[:3]}")
            m = result.metrics
            print(f"  admission={m.get('admission_mode')} microbatches={m.get('microbatches')} "
                  f"physical_forwards={m.get('physical_forwards')} denoise_s={m.get('denoise_s', 0):.3f}")
        else:
            print(f"  error: {result.error_code}: {result.error}")
        print("\nmetrics: " + (f"http://{server.DEFAULT_HOST}:{args.metrics_port}/metrics"
                               if args.metrics_port >= 0 else "off (--metrics-port -1)"))
        ports = ""  # the hint must dial the ports this demo bound, not submit's defaults
        if (args.request_port, args.control_port) != (server.DEFAULT_REQUEST_PORT, server.DEFAULT_CONTROL_PORT):
            ports = f" --request-port {args.request_port} --control-port {args.control_port}"
        print(f"try:     .venv/bin/candidate-scheduler submit --count 8 --reducer medoid --synthetic{ports}")
        if args.once:
            return 0 if result.ok else 1
        print("serving; Ctrl-C to stop", flush=True)
        serving = True
        code = service.wait()
        if code != 0:  # the service died under the user, not stopped by them: say so, and fail
            print(f"the service exited with code {code}; see the log above", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        # Ctrl-C is how one stops a serving demo; before the group is answered (or with --once, where a
        # CI runner's timeout sends SIGTERM) the demo did not do its job, and the exit code says so
        return 0 if serving else 130
    finally:
        client.close()
        if service.poll() is None:
            service.send_signal(signal.SIGINT)
            try:
                service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                service.kill()


def cmd_bench(args) -> int:
    from candidate_scheduler.bench.cli import build_parser, main

    rest = [a for a in args.bench_args if a != "--"]
    return main(build_parser().parse_args(rest))


def cmd_http(args) -> int:
    """sglang's HTTP server on the compat socket. Off loopback it needs --tokens (or --insecure):
    StartupRefused, one line, before sglang is imported."""
    from candidate_scheduler.service.endpoints import is_loopback_host
    from candidate_scheduler.service.keys import load_tokens
    from candidate_scheduler.service.tls import TlsError, cleartext_token_warning, pair_refusal

    why = pair_refusal(args.tls_cert, args.tls_key)
    if why is not None:
        raise server.StartupRefused(why)
    tls = None if args.tls_cert is None else (args.tls_cert, args.tls_key)
    tokens = None
    if args.tokens is not None:
        tokens = load_tokens(args.tokens)  # KeyDirError: one line
        if not tokens.by_token:
            print(f"candidate-scheduler http: note: no tokens in {args.tokens}/authorized_tokens: every request "
                  f"but the health probes is refused (`candidate-scheduler keys {args.tokens} --token NAME`, "
                  "then restart)", file=sys.stderr, flush=True)
        if tls is None and not is_loopback_host(args.http_host):
            print(f"candidate-scheduler http: {cleartext_token_warning('the HTTP server', args.http_host)}",
                  file=sys.stderr, flush=True)
    elif not is_loopback_host(args.http_host):
        if not args.insecure:
            raise server.StartupRefused(
                f"refusing to serve HTTP on {args.http_host} without tokens: pass --tokens DIR (`candidate-scheduler "
                "keys DIR --token NAME` writes one), bind loopback, or pass --insecure to let anyone who reaches it "
                "submit work")
        print("!" * 78 + f"\nWARNING: the HTTP server is bound to NON-LOOPBACK {args.http_host} WITHOUT tokens "
              "(--insecure):\nanyone who reaches this port can submit work.\n" + "!" * 78, file=sys.stderr, flush=True)
    from candidate_scheduler.compat.http import run_http_server

    try:  # it reads the TLS pair before anything is imported or listens: a bad one is this one line
        run_http_server(args.compat_port, args.model, args.http_host, args.http_port, tokens=tokens,
                        insecure=bool(args.insecure), header_timeout_s=args.header_timeout, tls=tls)
    except TlsError as exc:
        raise server.StartupRefused(str(exc)) from None
    return 0


