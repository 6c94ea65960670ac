"""The sglang compat bridge: sglang 0.5.23's scheduler socket in front of candidate_scheduler.

    python -m candidate_scheduler.compat.bridge --bind tcp://127.0.0.1:5558 \\
        --scheduler tcp://127.0.0.1:5555 [--control tcp://127.0.0.1:5556] [--allow-nonlocal]

A separate process, so the scheduler itself never unpickles. It binds a ZMQ ROUTER exactly like
sglang's Scheduler (frames ``[identity, b"", pickle(payload)]``, exactly one
``[identity, b"", pickle(OutputBatch)]`` reply per message; anything else is ignored), reads every
payload through the allow-list unpickler (`compat.unpickle`), and forwards each generation request as
ONE native candidate group to the scheduler's request socket through `AsyncClient` (many groups in
flight on one connection, matched by request_id). It never imports sglang.

- ``{"method": "ping"}`` is answered from the receive loop itself, never queued behind work.
- ``ShutdownReq`` is answered, then the bridge stops. The scheduler keeps running unless
  ``--shutdown-scheduler`` (with ``--control``) is given, in which case it is asked to SHUTDOWN too.
- Warmup Reqs (``is_warmup``; server-based warmup sends them with ``return_warmup_result``) get an
  empty successful OutputBatch at once, which is what sglang's scheduler returns for them after
  dropping the payload; they are not run (the scheduler's workers warm themselves).
- Every request is answered, whatever happens to the scheduler: AsyncClient PINGs it when it falls
  silent, so a scheduler that died, or restarted and lost the group, is noticed within about
  2-3 x ``--liveness`` seconds and the request is answered with an error (a dropped connection to the
  same run is handled by sending the group again). Requests the bridge cannot take -- more than
  ``--max-in-flight`` at once -- are answered with an error at once; and so is every request still
  open when the bridge stops.
- With ``--request-timeout``, a request that gets no result in time is answered with an error; with
  ``--control`` too, its group is then cancelled. (sglang's protocol has no cancel message; a client-side RPC
  timeout cannot be seen here: libzmq's ROUTER_NOTIFY, which would report the disconnect, is a draft
  API that pyzmq wheels do not enable.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from candidate_scheduler import arg_types, protocol
from candidate_scheduler.compat.classify import Answer, Ping, Shutdown, Warmup, classify
from candidate_scheduler.compat.errors import CompatError, RefusedPickle
from candidate_scheduler.compat.foreign import dumps_output_batch, error_reply
from candidate_scheduler.compat.mapping import plan_generation
from candidate_scheduler.compat.replies import reply_for_result
from candidate_scheduler.compat.unpickle import MAX_PICKLE_BYTES, safe_loads
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import DEFAULT_LIVENESS_S
from candidate_scheduler.service.endpoints import ipv6_for, is_loopback_endpoint
from candidate_scheduler.service.keys import ENV_KEYS, ClientKeys
from candidate_scheduler.service.replies import ClientClosed, SchedulerUnavailable, ServiceError

log = logging.getLogger("candidate_scheduler.compat.bridge")

DEFAULT_BIND = "tcp://127.0.0.1:5558"
DEFAULT_SCHEDULER = "tcp://127.0.0.1:5555"
# Payloads this small are decoded inside the receive loop (a pickled ping is ~30 bytes); bigger ones
# in a worker thread, so a large request never delays a ping.
INLINE_DECODE_BYTES = 512
REPORT_INTERVAL_S = 1.0
# Requests being decoded, planned or awaited at once; past this a request is answered "busy" from the
# receive loop, so one client cannot make the bridge hold unbounded tasks (and their payloads).
DEFAULT_MAX_IN_FLIGHT = 1024
# Decodes and plans at once (each holds a payload of up to 64 MiB and its decoded observations).
DEFAULT_MAX_DECODES = 8
# Bytes held for requests at once: payloads waiting to be decoded, then the observations of groups
# waiting on the scheduler. max_in_flight alone let 1024 payloads of 64 MiB each be held (64 GiB).
DEFAULT_MAX_HELD_BYTES = 2 << 30
# How long shutdown waits for requests to finish before answering the rest with an error.
SHUTDOWN_GRACE_S = 5.0
READY_PREFIX = "candidate-scheduler compat bridge: listening on"


@dataclass
class BridgeConfig:
    bind: str = DEFAULT_BIND
    scheduler: str = DEFAULT_SCHEDULER
    control: str | None = None
    allow_nonlocal: bool = False
    max_message_bytes: int = MAX_PICKLE_BYTES
    request_timeout_s: float | None = None
    shutdown_scheduler: bool = False
    liveness_s: float = DEFAULT_LIVENESS_S
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_decodes: int = DEFAULT_MAX_DECODES
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES


class _Request:
    """One client message, answered exactly once (`Bridge._answer`): by its task, or by shutdown when the
    task did not finish in time."""

    __slots__ = ("identity", "answered", "forwarding", "held")

    def __init__(self, identity: bytes, held: int = 0):
        self.identity = identity
        self.answered = False
        self.forwarding = False  # waiting on the scheduler: shutdown answers it at once
        self.held = held  # bytes counted against max_held_bytes while its task runs


class Bridge:
    def __init__(self, config: BridgeConfig, ctx: zmq.asyncio.Context | None = None):
        self.config = config
        self.ctx = ctx or zmq.asyncio.Context()
        self._own_ctx = ctx is None
        self.stats: collections.Counter = collections.Counter()  # event tallies, for logs and tests
        self.last_refusal = ""
        self._report_requests: dict[str, int] = {}
        self._report_errors: dict[str, int] = {}
        self.stopping = asyncio.Event()
        self._tasks: dict[asyncio.Task, _Request] = {}
        self._held_bytes = 0
        self._decodes = asyncio.Semaphore(max(1, config.max_decodes))
        self.router = self.control = None
        self.client: AsyncClient | None = None
        self.endpoint: str | None = None

    # ---- sockets ----------------------------------------------------------------------------------
    def bind(self) -> str:
        cfg = self.config
        if not is_loopback_endpoint(cfg.bind):
            if not cfg.allow_nonlocal:
                raise SystemExit(
                    f"refusing to bind the sglang compat socket to {cfg.bind}: it accepts pickles from anyone "
                    "who can reach it. Bind loopback or ipc://, or pass --allow-nonlocal.")
            print("!" * 78 + f"\nWARNING: the sglang compat socket is bound to NON-LOOPBACK {cfg.bind}.\n"
                  "It is unauthenticated. Payloads are read through an allow-list unpickler, but anyone\n"
                  "who reaches this port can submit work and shut this bridge down.\n" + "!" * 78,
                  file=sys.stderr, flush=True)
        router = ipv6_for(self.ctx.socket(zmq.ROUTER), cfg.bind)
        router.setsockopt(zmq.LINGER, 1000)
        router.setsockopt(zmq.MAXMSGSIZE, int(cfg.max_message_bytes))
        if cfg.bind.startswith("tcp://") and cfg.bind.endswith(":0"):
            port = router.bind_to_random_port(cfg.bind[: -len(":0")])
            self.endpoint = f"{cfg.bind[: -len(':0')]}:{port}"
        else:
            router.bind(cfg.bind)
            self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = router
        # the scheduler's sockets take a key when it has a key directory: serve hands the bridge a
        # run-time proxy pair (service/keys.py); every sglang client is then this one principal
        keys = ClientKeys.from_env(os.environ[ENV_KEYS]) if os.environ.get(ENV_KEYS) else None
        # AsyncClient, not a bare DEALER: it notices a scheduler that died or restarted (liveness PINGs, the
        # run's incarnation) and a dropped connection, so no forwarded request waits forever
        self.client = AsyncClient(cfg.scheduler, keys, liveness_s=cfg.liveness_s, control=cfg.control)
        if cfg.control is not None:
            control = ipv6_for(self.ctx.socket(zmq.DEALER), cfg.control)
            control.setsockopt(zmq.LINGER, 500)
            if keys is not None:
                keys.apply(control)
            control.connect(cfg.control)
            self.control = control
        return self.endpoint

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for sock in (self.router, self.control):
            if sock is not None:
                sock.close()
        if self._own_ctx:
            self.ctx.term()

    # ---- main loops -------------------------------------------------------------------------------
    async def serve(self) -> None:
        if self.router is None:
            self.bind()
        loops = [asyncio.create_task(self._recv_clients(), name="receive")]
        if self.control is not None:
            loops.append(asyncio.create_task(self._drain_control(), name="control"))
            loops.append(asyncio.create_task(self._report_loop(), name="report"))
        stop = asyncio.create_task(self.stopping.wait())
        try:
            done, _ = await asyncio.wait([stop, *loops], return_when=asyncio.FIRST_COMPLETED)
            ended = [t for t in done if t is not stop]
            if ended:
                # A loop that ends alone (a bug, a socket error) left a process that answered nothing, pings
                # included, while it looked alive: it ends the bridge instead, with the error, for its
                # supervisor to see and restart it
                error = None if ended[0].cancelled() else ended[0].exception()
                raise RuntimeError(f"the compat bridge's {ended[0].get_name()} loop ended: "
                                   f"{type(error).__name__ if error else 'returned'}: {error or ''}") from error
        finally:
            stop.cancel()
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._finish_requests()

    async def _finish_requests(self) -> None:
        """Answer every request still open. Those waiting on the scheduler are answered at once (it may
        never answer); those still being decoded or planned get `SHUTDOWN_GRACE_S`, then an error too --
        a worker thread cannot be interrupted, but its client need not wait for it."""
        stopping = error_reply("candidate_scheduler: the compat bridge is shutting down")
        for task, request in list(self._tasks.items()):
            if request.forwarding:
                task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=SHUTDOWN_GRACE_S)
        for task, request in list(self._tasks.items()):
            task.cancel()
            await self._answer(request, stopping)

    def stop(self) -> None:
        self.stopping.set()

    async def _recv_clients(self) -> None:
        while True:
            frames = await self.router.recv_multipart(copy=True)
            # sglang's scheduler ignores anything without a complete REQ envelope; so do we.
            if len(frames) != 3 or frames[1] != b"":
                self.stats["ignored"] += 1
                self._count("bad_frames", error=True)
                continue
            identity, _, payload = frames
            self.stats["received"] += 1
            obj: Any = None
            if len(payload) <= INLINE_DECODE_BYTES:
                try:
                    obj = safe_loads(payload, self.config.max_message_bytes)
                except RefusedPickle as exc:
                    await self._refused(identity, exc)
                    continue
                try:
                    ping = isinstance(classify(obj), Ping)
                except Exception:  # answered by `_handle`: this loop must outlive any payload
                    ping = False
                if ping:
                    self.stats["pings"] += 1
                    self._count("ping")
                    await self._reply(identity, dumps_output_batch())
                    continue
            # one request alone is always taken: the message size limit bounds it
            over_bytes = bool(self._tasks) and self._held_bytes + len(payload) > self.config.max_held_bytes
            if len(self._tasks) >= self.config.max_in_flight or over_bytes:
                self.stats["busy"] += 1
                self._count("busy", error=True)
                await self._reply(identity, error_reply(
                    f"candidate_scheduler compat bridge: busy ({len(self._tasks)} requests in flight, "
                    f"{self._held_bytes} bytes held); try again"))
                continue
            request = _Request(identity, len(payload))
            self._held_bytes += request.held
            self._spawn(request, self._handle(request, payload, obj))

    def _count(self, kind: str, error: bool = False) -> None:
        table = self._report_errors if error else self._report_requests
        table[kind] = table.get(kind, 0) + 1

    async def _report_loop(self) -> None:
        """Every second, tell the scheduler what sglang sent us, so one /metrics shows it all."""
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            if self._report_requests or self._report_errors:
                sent_requests, sent_errors = self._report_requests, self._report_errors
                report = protocol.CompatReport(requests=sent_requests, errors=sent_errors)
                self._report_requests, self._report_errors = {}, {}
                if not await self._control_send(protocol.encode(protocol.Kind.COMPAT_REPORT, report)):
                    # the scheduler away: counters it adds up would miss these for good; the next report
                    # carries them (the keys are a fixed few, so what is kept stays small)
                    for table, sent in ((self._report_requests, sent_requests), (self._report_errors, sent_errors)):
                        for kind, n in sent.items():
                            table[kind] = table.get(kind, 0) + n

    async def _control_send(self, frames: list[bytes]) -> bool:
        """Send on the control socket without waiting: with the scheduler down its queue fills, and a
        blocked send would hold whatever awaits it (a reply, the report loop). Lost, a CANCEL or a report
        changes nothing a client sees."""
        try:
            await self.control.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # Again: the queue is full (scheduler down); or the socket is closing
            self.stats["control_dropped"] += 1
            log.debug("control message dropped: %s", exc)
            return False

    async def _drain_control(self) -> None:
        while True:
            await self.control.recv_multipart()  # CONTROL_REPLY to our CANCEL / SHUTDOWN: nothing to do

    # ---- one message ------------------------------------------------------------------------------
    def _spawn(self, request: _Request, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks[task] = request
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        request = self._tasks.pop(task, None)
        if request is not None:
            self._held_bytes -= request.held
            request.held = 0

    def _hold(self, request: _Request, nbytes: int) -> None:
        """Count `nbytes` for `request` from now on, instead of what it held before (its payload)."""
        self._held_bytes += nbytes - request.held
        request.held = nbytes

    async def _answer(self, request: _Request, payload: bytes) -> None:
        if request.answered:
            return
        request.answered = True  # before the send: a cancellation during it must not answer twice
        await self._reply(request.identity, payload)

    async def _reply(self, identity: bytes, payload: bytes) -> None:
        try:
            await self.router.send_multipart([identity, b"", payload])
        except zmq.ZMQError as exc:  # peer gone or socket closing: nobody to answer
            log.debug("reply dropped: %s", exc)

    def _note_refusal(self, exc: Exception) -> bytes:
        self.stats["refused"] += 1
        self._count("pickle_refused", error=True)
        self.last_refusal = str(exc)[:300]
        # a peer can send refusals as fast as it likes: the first few are logged, then one in a thousand
        self.stats["pickle_refused"] += 1
        refused = self.stats["pickle_refused"]
        if refused <= 10 or refused % 1000 == 0:
            log.warning("%s (refused payloads so far: %d)", str(exc)[:300], refused)
        return error_reply(str(exc))

    async def _refused(self, identity: bytes, exc: Exception) -> None:
        await self._reply(identity, self._note_refusal(exc))

    async def _handle(self, request: _Request, payload: bytes, obj: Any) -> None:
        try:
            if obj is None:
                try:
                    async with self._decodes:
                        obj = await asyncio.to_thread(safe_loads, payload, self.config.max_message_bytes)
                except RefusedPickle as exc:
                    await self._answer(request, self._note_refusal(exc))
                    return
            del payload  # the decoded object is what is kept from here on
            msg = classify(obj)
            if isinstance(msg, Ping):
                self.stats["pings"] += 1
                self._count("ping")
                await self._answer(request, dumps_output_batch())
            elif isinstance(msg, Shutdown):
                self._count("shutdown")
                await self._answer(request, dumps_output_batch())
                if self.config.shutdown_scheduler and self.control is not None:
                    await self._control_send(protocol.encode(protocol.Kind.SHUTDOWN, protocol.Empty()))
                log.warning("ShutdownReq received: stopping the compat bridge")
                self.stop()
            elif isinstance(msg, Warmup):
                self.stats["warmups"] += 1
                self._count("warmup")
                await self._answer(request, dumps_output_batch())
            elif isinstance(msg, Answer):
                self.stats["answered_locally"] += 1
                self._count("unknown" if msg.error.startswith("Unknown request type") else "control")
                await self._answer(request, error_reply(msg.error))
            else:
                self._count("req" if len(msg.reqs) == 1 else "req_list")
                # handed over in a holder, no reference kept here: the decoded Reqs (their pickled images, as
                # many bytes again as the observations counted while the group waits) go once planned
                holder = [msg.reqs]
                del obj, msg
                await self._generate(request, holder)
        except asyncio.CancelledError:  # the bridge is stopping (`_finish_requests`)
            await asyncio.shield(self._answer(request, error_reply(
                "candidate_scheduler: the compat bridge is shutting down")))
            raise
        except Exception as exc:  # exactly one reply, whatever happened
            log.exception("compat bridge failed on a request")
            await self._answer(request, error_reply(f"candidate_scheduler compat bridge: internal error: "
                                                    f"{type(exc).__name__}: {exc}"))

    async def _generate(self, request: _Request, holder: list) -> None:
        """`holder`: [the Generation's reqs], taken out here so that nothing holds them once planned."""
        reqs = holder.pop()
        try:
            async with self._decodes:
                plan = await asyncio.to_thread(plan_generation, reqs)
        except CompatError as exc:
            self.stats["answered_locally"] += 1
            await self._answer(request, error_reply(str(exc)))
            return
        finally:
            del reqs
        rid = plan.submit.request_id
        # the payload is gone; the observations stay until the scheduler answers (a resend needs them).
        # Admission saw only the payload, and an image decodes to hundreds of times its compressed bytes:
        # the budget is checked again with what is held from now on (one request alone is still taken)
        observed = len(plan.submit.images.data)
        others = self._held_bytes - request.held
        if others > 0 and others + observed > self.config.max_held_bytes:
            self.stats["busy"] += 1
            self._count("busy", error=True)
            await self._answer(request, error_reply(
                f"candidate_scheduler compat bridge: busy ({others} bytes held for other requests, "
                f"{observed} more to hold for this one); try again"))
            return
        self._hold(request, observed)
        self.stats["forwarded"] += 1
        request.forwarding = True
        timeout = self.config.request_timeout_s
        try:
            # the send is inside the timeout too: with the scheduler down its queue fills and sends wait
            result = await asyncio.wait_for(self.client.submit_request(plan.submit), timeout)
        except TimeoutError:
            self.stats["timeouts"] += 1
            # answer first: the cancel is best effort, and must not hold the reply
            await self._answer(request, error_reply(
                f"candidate_scheduler: no result within {timeout} s"
                + (" (group cancelled)" if self.control is not None else "")))
            await self._cancel(rid)
            return
        except SchedulerUnavailable as exc:
            self.stats["unavailable"] += 1
            self._count("scheduler_unavailable", error=True)
            await self._answer(request, error_reply(f"candidate_scheduler: scheduler unavailable: {exc}"))
            return
        except ServiceError as exc:
            self.stats["failed"] += 1
            await self._answer(request, error_reply(
                f"candidate_scheduler: {exc.reply.error_code}: {exc.reply.error}"))
            return
        except ClientClosed:
            await self._answer(request, error_reply("candidate_scheduler: the compat bridge is shutting down"))
            return
        finally:
            request.forwarding = False
        if result.status == "done":
            self.stats["done"] += 1
        else:
            self.stats["failed"] += 1
        reply = await asyncio.to_thread(reply_for_result, plan, result)
        await self._answer(request, reply)

    async def _cancel(self, rid: str) -> None:
        if self.control is not None:
            await self._control_send(protocol.encode(protocol.Kind.CANCEL, protocol.CancelRequest(request_id=rid)))


def _warm_imports() -> None:
    """Import torch and PIL in the background: replies carry a torch tensor, and the first request
    should not pay for the import inside the event loop."""

    def run():
        try:
            import PIL.Image  # noqa: F401
            import torch  # noqa: F401
        except Exception:  # pragma: no cover - reported when a request needs them
            pass

    threading.Thread(target=run, name="warm-imports", daemon=True).start()


async def run_bridge(config: BridgeConfig, on_bound=None) -> collections.Counter:
    bridge = Bridge(config)
    endpoint = bridge.bind()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, bridge.stop)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    if on_bound is not None:
        on_bound(bridge, endpoint)
    try:
        await bridge.serve()
    finally:
        bridge.close()
    return bridge.stats


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m candidate_scheduler.compat.bridge", description=__doc__.split("\n")[0])
    p.add_argument("--bind", default=DEFAULT_BIND,
                   help=f"sglang-compatible ROUTER endpoint (default {DEFAULT_BIND}; tcp://127.0.0.1:0 picks a port)")
    p.add_argument("--scheduler", default=DEFAULT_SCHEDULER,
                   help=f"the scheduler's native request endpoint (default {DEFAULT_SCHEDULER})")
    p.add_argument("--control", default=None,
                   help="the scheduler's control endpoint: lets --request-timeout cancel the group, and enables "
                        "--shutdown-scheduler")
    p.add_argument("--allow-nonlocal", action="store_true", help="allow binding a non-loopback address (loud warning)")
    p.add_argument("--max-message-bytes", type=arg_types.positive_int, default=MAX_PICKLE_BYTES,
                   help="largest accepted payload (ZMQ MAXMSGSIZE and the unpickler's limit)")
    p.add_argument("--request-timeout", type=arg_types.positive_seconds, default=None,
                   help="seconds before an unanswered request gets an error reply (default: wait, like sglang)")
    p.add_argument("--liveness", type=arg_types.positive_seconds, default=DEFAULT_LIVENESS_S,
                   help="seconds of silence from the scheduler before it is PINGed; one that does not answer "
                        f"within as long again fails the requests it holds (default {DEFAULT_LIVENESS_S})")
    p.add_argument("--max-in-flight", type=arg_types.positive_int, default=DEFAULT_MAX_IN_FLIGHT,
                   help="requests held at once; more are answered 'busy' at once "
                        f"(default {DEFAULT_MAX_IN_FLIGHT})")
    p.add_argument("--max-held-bytes", type=arg_types.positive_int, default=DEFAULT_MAX_HELD_BYTES,
                   help="bytes held for requests at once (payloads, then observations); past it requests are "
                        f"answered 'busy' at once, but one alone is always taken (default {DEFAULT_MAX_HELD_BYTES})")
    p.add_argument("--shutdown-scheduler", action="store_true",
                   help="on ShutdownReq also ask the scheduler (via --control) to shut down")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.shutdown_scheduler and not args.control:
        print("--shutdown-scheduler needs --control", file=sys.stderr)
        return 2
    config = BridgeConfig(
        bind=args.bind, scheduler=args.scheduler, control=args.control, allow_nonlocal=args.allow_nonlocal,
        max_message_bytes=args.max_message_bytes, request_timeout_s=args.request_timeout,
        shutdown_scheduler=args.shutdown_scheduler, liveness_s=args.liveness, max_in_flight=args.max_in_flight,
        max_held_bytes=args.max_held_bytes,
    )

    def announce(_bridge: Bridge, endpoint: str) -> None:
        print(f"{READY_PREFIX} {endpoint} (scheduler {config.scheduler})", flush=True)
        _warm_imports()

    started = time.monotonic()
    stats = asyncio.run(run_bridge(config, announce))
    log.warning("compat bridge stopped after %.0f s: %s", time.monotonic() - started, stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
