"""The service on Ray: the scheduler and N workers as Ray actors in a placement group, restarted by Ray.

RL frameworks place their rollout engines as Ray actors; this places ours the same way. `start()` (or
`candidate-scheduler up --ray ADDRESS`) reserves a placement group -- one bundle per worker with its
CPUs and GPUs, spread across nodes by default, and one small bundle for the scheduler -- and starts:

- `SchedulerActor`: runs `candidate-scheduler serve` as its child process on fixed ports (a scheduler
  Ray restarts comes back where workers and clients look for it);
- `WorkerActor` x N: each runs `candidate-scheduler worker --worker-id ray-worker-I` as its child. When
  the actor dies Ray restarts it (`max_restarts`); the new worker registers under the same id, so the
  scheduler retries its slices from their snapshots at once instead of waiting out a heartbeat.

Each child is tied to its actor (killed when the actor's process dies, even by SIGKILL): `ray stop`,
`RayService.shutdown()` or the end of the driver that started it leave nothing behind. A child, not the
actor's own process, runs the service: the scheduler's loop keeps its own process as deployed, and a
worker's torch and sglang stay out of Ray's worker process.

`RayService.client_spec()` is a small picklable value (endpoints, and keys when the scheduler takes
them) that Ray tasks and actors turn into a client: `spec.client()`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from candidate_scheduler.service.launcher import ENDPOINT_LINE, LAST_SERVE_LINE, child_env, wait_for_workers
from candidate_scheduler.service.processes import ChildProcess

NAMESPACE = "candidate_scheduler"
DEFAULT_NAME = "candidate-scheduler"
_READY_S = 300.0
_KEEP_LINES = 10_000  # of an actor's child's output in memory (its log keeps all): its start-up lines, and more
# How long `RayService.shutdown` lets the scheduler answer its groups in flight: serve's own
# --stop-grace-s (25 s by default) and a few seconds to say so and exit
STOP_GRACE_S = 30.0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "candidate_scheduler.cli", *args]


def _log_path(log_dir: str | None, name: str) -> Path:
    return Path(log_dir or tempfile.gettempdir()) / f"candidate-scheduler-ray-{name}"


def _log_dir(log_dir: str | None, name: str) -> Path:
    d = _log_path(log_dir, name)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _go_with(proc: ChildProcess, what: str, stopping: threading.Event | None = None) -> None:
    """End this actor's process when its service process exits, whatever the cause (a crash, the OOM
    killer, an operator's `worker-leave` or `shutdown`): Ray restarts an actor whose process died, not one
    that lives on without its service, which held its bundle for good while the worker or the scheduler
    was gone. (`ray.kill` of the actor kills the child instead: die_with_parent.) Not once `stopping` is
    set: a service stopped on purpose must not come back."""
    def watch() -> None:
        code = proc.proc.wait()
        if stopping is not None and stopping.is_set():
            return
        print(f"candidate-scheduler on Ray: the {what} process exited ({code}); ending its actor for Ray to "
              "restart it", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="watch-service").start()


@ray.remote(num_cpus=0)
class SchedulerActor:
    """`serve` as this actor's child; its endpoints as the rest of the cluster reaches them."""

    def __init__(self, serve_args: list[str], log_dir: str):
        self.proc = ChildProcess(_cli("serve", *serve_args), Path(log_dir) / f"scheduler-{os.getpid()}.log",
                                 env=child_env(), tied=True, keep_lines=_KEEP_LINES)
        self.proc.wait_line(LAST_SERVE_LINE, _READY_S)
        found = {m.group(1): m.group(2) for line in self.proc.lines if (m := ENDPOINT_LINE.search(line))}
        ip = ray.util.get_node_ip_address()
        self._endpoints = {k: reachable_at(v, ip) for k, v in found.items() if v != "off"}
        # watched once it serves: a `serve` that cannot start fails the actor's creation with its log's path,
        # instead of being restarted into the same failure
        self._stopping = threading.Event()
        _go_with(self.proc, "scheduler", self._stopping)

    def stop(self, grace_s: float) -> int | None:
        """Stop `serve` as SIGTERM does: it admits nothing new and answers what it admitted (served, or
        refused as stopping once its own --stop-grace-s is spent) before it exits; after `grace_s` more, a
        SIGINT stops it at once. Its exit code (None: still running). The actor stays, for ray.kill."""
        self._stopping.set()
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGINT, 5.0)):
            if self.proc.proc.poll() is None:
                self.proc.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.proc.proc.wait(wait_s)
        return None

    def endpoints(self) -> dict[str, str]:
        return dict(self._endpoints)

    def pid(self) -> int:
        """The scheduler process's pid (the actor's child)."""
        return self.proc.pid


@ray.remote
class WorkerActor:
    """`worker` as this actor's child, under a fixed worker id."""

    def __init__(self, worker_args: list[str], log_dir: str):
        self.proc = ChildProcess(_cli("worker", *worker_args), Path(log_dir) / f"worker-{os.getpid()}.log",
                                 env=child_env(), tied=True, keep_lines=_KEEP_LINES)
        _go_with(self.proc, "worker")

    def pid(self) -> int:
        return self.proc.pid

    def actor_pid(self) -> int:
        return os.getpid()

    def alive(self) -> bool:
        return self.proc.alive()


@dataclass(frozen=True)
class ClientSpec:
    """What a Ray task or actor needs to reach the service: picklable, no sockets in it."""

    request: str
    control: str
    # ClientKeys.to_env() when the scheduler takes keys: it holds a secret key, so never in a repr (logs, tracebacks)
    keys: str | None = field(default=None, repr=False)

    def client(self, **kwargs):
        from candidate_scheduler.service.client import Client
        from candidate_scheduler.service.keys import ClientKeys

        keys = None if self.keys is None else ClientKeys.from_env(self.keys)
        return Client(self.request, self.control, keys=keys, **kwargs)

    def async_client(self, **kwargs):
        from candidate_scheduler.service.async_client import AsyncClient
        from candidate_scheduler.service.keys import ClientKeys

        keys = None if self.keys is None else ClientKeys.from_env(self.keys)
        kwargs.setdefault("control", self.control)
        return AsyncClient(self.request, keys=keys, **kwargs)


@dataclass
class RayService:
    name: str
    endpoints: dict[str, str]
    scheduler: Any  # the SchedulerActor handle
    workers: list[Any] = field(default_factory=list)  # WorkerActor handles
    group: Any = None  # the placement group (None when attached)
    keys: str | None = field(default=None, repr=False)  # ClientKeys.to_env(): a secret key, never in a repr

    def client_spec(self) -> ClientSpec:
        return ClientSpec(self.endpoints["request endpoint"], self.endpoints["control endpoint"], self.keys)

    def client(self, **kwargs):
        return self.client_spec().client(**kwargs)

    def wait_workers(self, n: int | None = None, timeout_s: float = _READY_S, check=None) -> dict:
        """Poll STATS until `n` (default: every worker placed) are registered; that STATS detail.
        `check()` runs before each poll and raises to stop waiting (launcher.wait_for_workers)."""
        n = len(self.workers) if n is None else n
        with self.client(liveness_s=None) as c:
            return wait_for_workers(c, n, timeout_s, 0.2, check)

    def shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the scheduler gracefully while the workers still serve (its groups in flight are answered,
        for up to `grace_s`: killed outright, its clients learnt only from their liveness checks that it was
        gone), then kill every actor (their children die with them) and give the placement group back."""
        if self.scheduler is not None and grace_s > 0:
            with contextlib.suppress(Exception):  # gone already, or Ray itself is: the kills below still run
                ray.get(self.scheduler.stop.remote(grace_s), timeout=grace_s + 10.0)
        for actor in [*self.workers, *([] if self.scheduler is None else [self.scheduler])]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:  # noqa: BLE001 - removed already (a second shutdown)
                pass
            self.group = None


_WILDCARD = re.compile(r"^(tcp://)(?:0\.0\.0\.0|\*)(?=:\d+$)")


def reachable_at(endpoint: str, ip: str) -> str:
    """`endpoint` as the rest of the cluster reaches it: a wildcard bind at this node's address (only the
    host: 10.0.0.0 is not a wildcard)."""
    return _WILDCARD.sub(lambda m: m.group(1) + ip, endpoint)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _keys_of(serve_args: list[str], key: str) -> str | None:
    """`key`'s client keys from the key directory `serve` is given, read as argparse reads it (either form,
    the last one wins): a scheduler that takes keys answers nothing to a driver without them."""
    curve_dir = None
    for i, token in enumerate(serve_args):
        if token == "--curve-dir" and i + 1 < len(serve_args):
            curve_dir = serve_args[i + 1]
        elif token.startswith("--curve-dir="):
            curve_dir = token.split("=", 1)[1]
    if curve_dir is None:
        return None
    from candidate_scheduler.service.keys import ClientKeys

    return ClientKeys.load(curve_dir, key).to_env()


def start(workers: int = 1, *, worker_args: tuple[str, ...] = (), serve_args: tuple[str, ...] = (),
          gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0, strategy: str = "SPREAD",
          max_restarts: int = 3, name: str = DEFAULT_NAME, free_ports: bool = False, key: str = "admin",
          log_dir: str | None = None, ready_timeout_s: float = _READY_S) -> RayService:
    """Place the scheduler and `workers` workers on the connected Ray cluster (ray.init first).

    serve_args / worker_args: flags of `serve` and `worker` (not --scheduler or --worker-id). Ports:
    serve's own defaults unless given; `free_ports` picks free ones on this host (a one-node cluster,
    as in tests). The scheduler is a named actor (`name`, namespace "candidate_scheduler"): `attach`
    finds it from another driver while this one lives."""
    serve = list(serve_args)
    if free_ports:
        request, control, worker_port, compat = _free_ports(4)
        serve += ["--request-port", str(request), "--control-port", str(control), "--worker-port", str(worker_port),
                  "--compat-port", str(compat)]
    logs = str(_log_dir(log_dir, name))
    bundles = [{"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
               for _ in range(workers)] + [{"CPU": 0.01}]
    keys = _keys_of(serve, key)  # a key directory it cannot read fails here, before anything is reserved
    group = placement_group(bundles, strategy=strategy)
    # a start that fails part way (a bundle that never fits, a scheduler that does not come up, Ctrl-C)
    # gives back what it took: else the reserved CPUs and GPUs stayed taken for as long as the driver
    # lived, and the next try waited for them in vain
    service = RayService(name, {}, None, [], group, keys)
    try:
        ray.get(group.ready(), timeout=ready_timeout_s)

        def in_bundle(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i)

        service.scheduler = SchedulerActor.options(name=name, namespace=NAMESPACE, max_restarts=max_restarts,
                                                   scheduling_strategy=in_bundle(workers)).remote(serve, logs)
        service.endpoints = ray.get(service.scheduler.endpoints.remote(), timeout=ready_timeout_s)
        for i in range(workers):
            args = ["--scheduler", service.endpoints["worker link"], "--worker-id", f"ray-worker-{i}", *worker_args]
            service.workers.append(WorkerActor.options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                                                       max_restarts=max_restarts, scheduling_strategy=in_bundle(i))
                                   .remote(args, logs))
    except BaseException:
        service.shutdown()
        raise
    return service


def attach(name: str = DEFAULT_NAME, key: str = "admin", curve_dir: str | None = None) -> RayService:
    """The service another driver started (`start` or `up --ray`), found by its scheduler's name."""
    scheduler = ray.get_actor(name, namespace=NAMESPACE)
    endpoints = ray.get(scheduler.endpoints.remote())
    keys = None
    if curve_dir is not None:
        from candidate_scheduler.service.keys import ClientKeys

        keys = ClientKeys.load(curve_dir, key).to_env()
    return RayService(name, endpoints, scheduler, keys=keys)


# `up` flags that are not `serve`'s: the workers' and Ray's own (each takes a value). One left out reaches
# `serve`, which refuses it and the scheduler actor never starts (tests/unit/test_ray_argv.py
# checks this against cli.py's parsers)
_NOT_SERVE = frozenset({"--model", "--device", "--capacity", "--adapter", "--conditioning-cache-mb", "--warmup-shapes",
                        "--memory-budget-mb", "--conditioning", "--call-rows", "--workers", "--ray", "--gpus-per-worker",
                        "--cpus-per-worker", "--max-restarts", "--placement"})


def serve_argv(up_argv: list[str]) -> list[str]:
    """`up`'s command line without the flags that are not `serve`'s."""
    out, skip = [], False
    for token in up_argv[1:] if up_argv[:1] == ["up"] else up_argv:
        if skip:
            skip = False
            continue
        flag = token.split("=", 1)[0]
        if flag in _NOT_SERVE:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def _dead_for_good(actor) -> bool:
    """Whether Ray will not bring `actor` back: it answers ActorDiedError once its restarts are spent, and
    ActorUnavailableError (not dead) while it restarts."""
    return bool(_dead_for_good_among([actor]))


def _dead_for_good_among(actors: list, timeout_s: float = 2.0) -> list[int]:
    """The positions of the `actors` Ray will not bring back (`_dead_for_good`), all asked at once."""
    refs = [a.pid.remote() for a in actors]
    deadline = time.monotonic() + timeout_s
    dead = []
    for i, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.ActorDiedError:
            dead.append(i)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # restarting, or busy: not gone
    return dead


_LOOK_S = 5.0  # how often `up --ray` asks Ray whether its actors are gone for good while it waits for workers


class _Gone(Exception):
    """An actor `up --ray` needs is dead and Ray will not restart it."""


class _Stopped(Exception):
    """Ctrl-C or SIGTERM came while `run_up` waited for the workers."""


def run_up(args, worker_flags: list[str]) -> int:
    """`candidate-scheduler up --ray ADDRESS`: place the service, print where it is, and hold it until
    Ctrl-C (or SIGTERM, or the cluster going away, or the scheduler actor dead for good: exit 1); then
    tear it down. While it waits for the workers, an actor dead for good (a worker that cannot start
    spends its restarts in seconds) or the wait's end is exit 1 too."""
    import signal
    import threading

    try:
        ray.init(address=None if args.ray == "local" else args.ray, namespace=NAMESPACE, log_to_driver=False,
                 **({"include_dashboard": False} if args.ray == "local" else {}))
    except ConnectionError as exc:  # no cluster there: one line that says the fix (cli.main), not a traceback
        from candidate_scheduler.service.server import StartupRefused

        raise StartupRefused(f"no Ray cluster at --ray {args.ray} ({str(exc).splitlines()[0]}): start one "
                             "(`ray start --head`), give its address, or pass --ray local for one on this "
                             "machine") from exc
    svc = start(args.workers, worker_args=tuple(worker_flags), serve_args=tuple(serve_argv(args.argv)),
                gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
                strategy=args.placement, max_restarts=args.max_restarts)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    looked = [time.monotonic()]

    def stopped() -> None:  # Ctrl-C while workers load (or never register) stops at once, not after the wait
        if stop.is_set():
            raise _Stopped
        if time.monotonic() - looked[0] < _LOOK_S:
            return
        looked[0] = time.monotonic()
        # a worker that cannot start (a bad flag, a model missing on its node) exhausts its restarts in
        # seconds: said then, not after the whole wait
        dead = _dead_for_good_among([svc.scheduler, *svc.workers])
        if dead:
            names = ["the scheduler" if i == 0 else f"worker ray-worker-{i - 1}" for i in dead]
            raise _Gone(f"{', '.join(names)}: the actor died and Ray will not restart it (--max-restarts "
                        f"{args.max_restarts} spent); its output is in {_log_path(None, svc.name)} on its node")

    try:
        for key in ("request endpoint", "control endpoint", "worker link", "metrics"):
            print(f"candidate-scheduler: {key:<17} {svc.endpoints.get(key, 'off')}", flush=True)
        print(f"candidate-scheduler: on Ray: scheduler actor {svc.name!r} (namespace {NAMESPACE}), "
              f"{args.workers} worker actor(s), placement {args.placement}", flush=True)
        stats = svc.wait_workers(check=stopped)
        print(f"candidate-scheduler: workers registered: {', '.join(sorted(stats['workers']))}", flush=True)
        while not stop.wait(1.0):
            if _dead_for_good(svc.scheduler):
                # else `up` held on for good while nothing served (its supervisor never knew)
                print("candidate-scheduler: the scheduler actor died and Ray will not restart it (--max-restarts "
                      "spent); stopping", file=sys.stderr, flush=True)
                return 1
    except _Stopped:
        pass
    except (_Gone, TimeoutError) as exc:  # one line, not a traceback; the service is taken down below
        print(f"candidate-scheduler: {exc}; stopping", file=sys.stderr, flush=True)
        return 1
    finally:
        svc.shutdown()
        ray.shutdown()
    return 0
