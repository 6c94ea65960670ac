"""`candidate-scheduler` command line: serve | worker | up | demo | submit | cancel | status | stats |
drain | shutdown | make-checkpoint | keys | bench | http."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from candidate_scheduler.service import server

DEFAULT_MODEL = ".cache/tiny-cosmos3"


def _endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def _add_scheduler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=server.DEFAULT_HOST, help="bind address of every socket (default 127.0.0.1)")
    p.add_argument("--request-port", type=int, default=server.DEFAULT_REQUEST_PORT, help="native request socket (default 5555)")
    p.add_argument("--control-port", type=int, default=server.DEFAULT_CONTROL_PORT, help="control socket (default 5556)")
    p.add_argument("--worker-port", type=int, default=server.DEFAULT_WORKER_PORT, help="worker link (default 5557)")
    p.add_argument("--worker-host", default=None, help="bind address of the worker link (default: --host); "
                   "a non-loopback address requires --curve-dir")
    p.add_argument("--compat-port", type=int, default=server.DEFAULT_COMPAT_PORT, help="sglang-compatible socket (default 5558)")
    p.add_argument("--no-compat", action="store_true", help="do not start the sglang-compatible bridge")
    p.add_argument("--compat-host", default=None, help="bind address of the sglang-compatible socket (default: --host)")
    p.add_argument("--compat-allow-nonlocal", action="store_true",
                   help="let the sglang-compatible socket bind a non-loopback address (it speaks pickle: think twice)")
    p.add_argument("--metrics-port", type=int, default=9464, help="Prometheus /metrics port (default 9464; 0 = any free port; -1 = off)")
    p.add_argument("--policy", default="microbatch", choices=["microbatch", "sequential", "reject"],
                   help="what to do with a group larger than a physical batch (default microbatch)")
    p.add_argument("--batching", default="dispatch", choices=["dispatch", "step"],
                   help="dispatch: a worker runs one batch from first step to last; step: groups join and leave a "
                        "worker's running batch at denoise-step boundaries (default dispatch)")
    p.add_argument("--max-queued-groups", type=int, default=1024, help="groups in flight before answering 'overloaded'")
    p.add_argument("--retry-limit", type=int, default=3, help="attempts per slice before the group fails (default 3)")
    p.add_argument("--heartbeat-interval", type=float, default=0.5, help="seconds between worker heartbeats")
    p.add_argument("--heartbeat-timeout", type=float, default=3.0, help="seconds without a heartbeat before a worker is dead")
    p.add_argument("--curve-dir", default=None, help="CURVE keys for the worker link (see `candidate-scheduler keys`)")


def _config(args) -> server.SchedulerConfig:
    from candidate_scheduler.core.admission import AdmissionPolicy

    return server.SchedulerConfig(
        request_endpoint=_endpoint(args.host, args.request_port),
        control_endpoint=_endpoint(args.host, args.control_port),
        worker_endpoint=_endpoint(args.worker_host or args.host, args.worker_port),
        metrics_host=args.host,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        policy=AdmissionPolicy(args.policy),
        batching=args.batching,
        max_queued_groups=args.max_queued_groups,
        retry_limit=args.retry_limit,
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        curve_dir=args.curve_dir,
    )


def _start_metrics(config: server.SchedulerConfig):
    if config.metrics_port is None:
        return None, None
    from candidate_scheduler.service import metrics

    m = metrics.SchedulerMetrics()
    _server, _thread, port = metrics.start_http_server(m, config.metrics_host, config.metrics_port)
    return m, f"http://{config.metrics_host}:{port}/metrics"


def _spawn_bridge(args, bound: dict[str, str]) -> tuple[subprocess.Popen | None, str | None]:
    """Start the sglang compat bridge (its own process: it never shares a process with the scheduler's
    state) and wait until it listens, so sglang's 2 s ping never meets a half-started bridge."""
    if args.no_compat:
        return None, None
    import re
    import threading

    endpoint = _endpoint(args.compat_host or args.host, args.compat_port)
    cmd = [sys.executable, "-m", "candidate_scheduler.compat.bridge", "--bind", endpoint,
           "--scheduler", bound["request"], "--control", bound["control"]]
    if args.compat_allow_nonlocal:
        cmd.append("--allow-nonlocal")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    listening = threading.Event()
    found: list[str] = []

    def relay() -> None:
        for line in proc.stdout:
            if not listening.is_set():
                m = re.search(r"listening on (\S+)", line)
                if m:
                    found.append(m.group(1))
                    listening.set()
                    continue
            sys.stdout.write(line)
            sys.stdout.flush()
        listening.set()

    threading.Thread(target=relay, daemon=True, name="bridge-log").start()
    listening.wait(60)
    if not found:
        proc.poll()
        raise SystemExit(f"the sglang compat bridge did not start (exit code {proc.returncode}); "
                         "use --no-compat to run without it")
    return proc, found[0]


def _serve(args, on_ready=None) -> None:
    config = _config(args)
    metrics, metrics_url = _start_metrics(config)
    scheduler = server.Scheduler(config, metrics)
    bound = scheduler.bind()
    print(f"candidate-scheduler: request endpoint  {bound['request']}", flush=True)
    print(f"candidate-scheduler: control endpoint  {bound['control']}", flush=True)
    print(f"candidate-scheduler: worker link       {bound['worker']}", flush=True)
    print(f"candidate-scheduler: metrics           {metrics_url or 'off'}", flush=True)
    bridge, compat = _spawn_bridge(args, bound)
    print(f"candidate-scheduler: sglang compat     {compat or 'off'}", flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: scheduler.stopping.set())
    if on_ready is not None:
        on_ready(scheduler, bound)
    try:
        scheduler.serve()
    finally:
        if bridge is not None:
            bridge.terminate()
            try:
                bridge.wait(timeout=5)
            except subprocess.TimeoutExpired:
                bridge.kill()


def cmd_serve(args) -> int:
    _serve(args)
    return 0


def _worker_cmd(args, endpoint: str) -> list[str]:
    cmd = [sys.executable, "-m", "candidate_scheduler.cli", "worker", "--scheduler", endpoint,
           "--adapter", args.adapter, "--device", args.device]
    if args.model:
        cmd += ["--model", args.model]
    if args.capacity:
        cmd += ["--capacity", str(args.capacity)]
    return cmd


def cmd_up(args) -> int:
    """A scheduler plus N local workers in one command (the demo layout)."""
    procs: list[subprocess.Popen] = []

    def on_ready(_scheduler, bound):
        for i in range(args.workers):
            procs.append(subprocess.Popen(_worker_cmd(args, bound["worker"])))
            print(f"candidate-scheduler: worker {i} pid {procs[-1].pid} ({args.adapter}, {args.device})", flush=True)

    try:
        _serve(args, on_ready)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


def cmd_worker(args) -> int:
    from candidate_scheduler.worker.loop import Worker, build_adapter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    adapter = build_adapter(args.adapter, args.model, args.device, args.capacity)
    if getattr(args, "fault", None):
        from candidate_scheduler.worker.faults import wrap

        adapter = wrap(adapter, args.fault)  # test/drill knob: see workers/faults.py
    worker = Worker(args.scheduler, adapter, capacity=args.capacity, device=args.device,
                    worker_id=args.worker_id, curve_dir=args.curve_dir, step_delay_s=args.step_delay)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    print(f"candidate-scheduler worker {worker.worker_id}: connecting to {args.scheduler}", flush=True)
    worker.serve()
    return 0


def _client(args):
    from candidate_scheduler.service.client import Client

    host = getattr(args, "host", server.DEFAULT_HOST)
    return Client(_endpoint(host, args.request_port), _endpoint(host, args.control_port))


def cmd_submit(args) -> int:
    import numpy as np

    from candidate_scheduler.service.client import make_request, synthetic_image

    if args.image:
        from PIL import Image

        image = np.asarray(Image.open(args.image).convert("RGB"), dtype=np.uint8)
    else:
        image = synthetic_image(args.height, args.width, seed=args.image_seed)
    request = make_request(
        image, args.prompt, request_id=args.request_id, count=args.count, reducer=args.reducer,
        return_candidates=args.return_candidates, seed=args.seed, seed_policy=args.seed_policy,
        deadline_s=args.deadline, height=args.height, width=args.width, steps=args.steps, horizon=args.horizon,
        guidance_scale=args.guidance, domain_id=args.domain_id, raw_action_dim=args.raw_action_dim,
    )
    with _client(args) as client:
        try:
            result = client.wait(client.send(request), timeout_s=args.timeout)
        except TimeoutError as exc:
            print(json.dumps({"request_id": request.request_id, "status": "timeout", "error": str(exc)}))
            return 3
    out = result.to_json()
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0 if result.ok else 1


def cmd_control(args) -> int:
    with _client(args) as client:
        if args.command == "cancel":
            reply = client.cancel(args.request_id)
        elif args.command == "status":
            reply = client.status(args.request_id)
        elif args.command == "drain":
            reply = client.drain()
        elif args.command == "shutdown":
            reply = client.shutdown()
        else:
            print(json.dumps(client.stats(), indent=2))
            return 0
    print(json.dumps({"ok": reply.ok, "changed": reply.changed, "state": reply.state, "detail": reply.detail,
                      "error": reply.error}))
    return 0 if reply.ok else 1


def cmd_make_checkpoint(args) -> int:
    from candidate_scheduler.worker.tiny_checkpoint import write_checkpoint

    print(write_checkpoint(args.dir))
    return 0


def cmd_keys(args) -> int:
    """Write CURVE key pairs: the scheduler's and one worker's, and authorise that worker."""
    import shutil

    import zmq.auth

    d = Path(args.dir)
    (d / "authorized_clients").mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(str(d), "server")
    zmq.auth.create_certificates(str(d), "client")
    shutil.copy(d / "client.key", d / "authorized_clients" / "client.key")
    os.chmod(d / "server.key_secret", 0o600)
    os.chmod(d / "client.key_secret", 0o600)
    print(f"wrote {d}/server.key[_secret], {d}/client.key[_secret]; authorised {d}/authorized_clients/client.key")
    return 0


def cmd_demo(args) -> int:
    """`make run`: a scheduler and a Cosmos3 worker on the tiny checkpoint, one candidate group."""
    import numpy as np

    from candidate_scheduler.service.client import Client, synthetic_image

    from candidate_scheduler.worker.tiny_checkpoint import ensure_checkpoint

    ensure_checkpoint(args.model)
    cmd = [sys.executable, "-m", "candidate_scheduler.cli", "up", "--model", args.model, "--workers", "1",
           "--request-port", str(args.request_port), "--control-port", str(args.control_port),
           "--worker-port", str(args.worker_port), "--compat-port", str(args.compat_port),
           "--metrics-port", str(args.metrics_port)]
    if args.no_compat:
        cmd.append("--no-compat")
    print("starting: " + " ".join(cmd), flush=True)
    service = subprocess.Popen(cmd)
    client = Client(_endpoint(server.DEFAULT_HOST, args.request_port), _endpoint(server.DEFAULT_HOST, args.control_port))
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
        print(f"\nmetrics: http://{server.DEFAULT_HOST}:{args.metrics_port}/metrics")
        print("try:     .venv/bin/candidate-scheduler submit --count 8 --reducer medoid --synthetic")
        if args.once:
            return 0 if result.ok else 1
        print("serving; Ctrl-C to stop", flush=True)
        service.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()
        if service.poll() is None:
            service.send_signal(signal.SIGINT)
            try:
                service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                service.kill()


def cmd_bench(args) -> int:
    from candidate_scheduler.bench import harness as bench

    return bench.main(args)


def cmd_http(args) -> int:
    from candidate_scheduler.compat.http import run_http_server

    run_http_server(args.compat_port, args.model, args.http_host, args.http_port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="candidate-scheduler", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the scheduler process")
    _add_scheduler_args(p)
    p.set_defaults(fn=cmd_serve)

    def worker_args(p, with_scheduler: bool):
        if with_scheduler:
            p.add_argument("--scheduler", default=_endpoint(server.DEFAULT_HOST, server.DEFAULT_WORKER_PORT),
                           help="the scheduler's worker link (default tcp://127.0.0.1:5557)")
            p.add_argument("--worker-id", default=None)
            p.add_argument("--step-delay", type=float, default=0.0, help="test knob: sleep this long before each denoise step")
        p.add_argument("--model", default=DEFAULT_MODEL, help="Cosmos3 checkpoint directory")
        p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
        p.add_argument("--capacity", type=int, default=None, help="candidates per physical batch (default: the model's)")
        p.add_argument("--adapter", default="cosmos3", choices=["cosmos3", "null"],
                       help="cosmos3 (the product) or null (a model-free adapter for tests and benchmarks)")

    p = sub.add_parser("worker", help="run a worker process")
    worker_args(p, True)
    p.add_argument("--curve-dir", default=None, help="CURVE keys (client.key_secret, server.key) for a remote scheduler")
    p.add_argument("--fault", default=None, metavar="SPEC",
                   help="test knob: inject worker faults, e.g. malformed:0.3,raise:0.1,seed=7 (see workers/faults.py)")
    p.set_defaults(fn=cmd_worker)

    p = sub.add_parser("up", help="a scheduler and N local workers")
    _add_scheduler_args(p)
    worker_args(p, False)
    p.add_argument("--workers", type=int, default=1)
    p.set_defaults(fn=cmd_up)

    p = sub.add_parser("demo", help="start everything on the tiny checkpoint and send one group (make run)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--once", action="store_true", help="exit after the demo group instead of serving on")
    p.add_argument("--no-compat", action="store_true")
    p.add_argument("--request-port", type=int, default=server.DEFAULT_REQUEST_PORT)
    p.add_argument("--control-port", type=int, default=server.DEFAULT_CONTROL_PORT)
    p.add_argument("--worker-port", type=int, default=server.DEFAULT_WORKER_PORT)
    p.add_argument("--compat-port", type=int, default=server.DEFAULT_COMPAT_PORT)
    p.add_argument("--metrics-port", type=int, default=9464)
    p.set_defaults(fn=cmd_demo)

    def client_args(p):
        p.add_argument("--host", default=server.DEFAULT_HOST)
        p.add_argument("--request-port", type=int, default=server.DEFAULT_REQUEST_PORT)
        p.add_argument("--control-port", type=int, default=server.DEFAULT_CONTROL_PORT)

    p = sub.add_parser("submit", help="send one candidate group and print the JSON reply")
    client_args(p)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--reducer", default="mean")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--seed-policy", default="per_candidate", choices=["per_candidate", "offset"])
    p.add_argument("--request-id", default=None)
    p.add_argument("--prompt", default="pick up the red cube")
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--horizon", type=int, default=16)
    p.add_argument("--guidance", type=float, default=1.0)
    p.add_argument("--domain-id", type=int, default=0)
    p.add_argument("--raw-action-dim", type=int, default=7)
    p.add_argument("--deadline", type=float, default=None, help="seconds before the group expires")
    p.add_argument("--return-candidates", action="store_true")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--image", default=None, help="an image file (RGB)")
    g.add_argument("--synthetic", action="store_true", help="a deterministic synthetic observation (default)")
    p.add_argument("--image-seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true", help="one-line JSON")
    p.set_defaults(fn=cmd_submit)

    for name, needs_id in (("cancel", True), ("status", True), ("stats", False), ("drain", False), ("shutdown", False)):
        p = sub.add_parser(name, help=f"control: {name}")
        client_args(p)
        if needs_id:
            p.add_argument("request_id")
        p.set_defaults(fn=cmd_control)

    p = sub.add_parser("make-checkpoint", help="write the tiny random-weight Cosmos3 checkpoint")
    p.add_argument("dir", nargs="?", default=DEFAULT_MODEL)
    p.set_defaults(fn=cmd_make_checkpoint)

    p = sub.add_parser("keys", help="write CURVE keys for remote workers")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_keys)

    p = sub.add_parser("bench", help="run the benchmarks (writes bench/results/)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--smoke", action="store_true", help="one repeat, small shape (CI)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="bench/results")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("http", help="sglang's own HTTP server pointed at this scheduler's compat socket")
    p.add_argument("--compat-port", type=int, default=server.DEFAULT_COMPAT_PORT)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--http-host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=30000)
    p.set_defaults(fn=cmd_http)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
