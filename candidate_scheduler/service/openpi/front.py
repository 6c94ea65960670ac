"""The openpi policy websocket in front of the scheduler: IO only.

openpi's protocol (`openpi_client.websocket_client_policy` + openpi's `websocket_policy_server`): on
connect the server sends one binary msgpack-numpy frame of metadata; then each binary frame the
client sends is one observation dict, answered by one binary frame (a dict with `actions`). A text
frame is an error: the client raises with its text. Unlike openpi's own server, which closes the
connection after an error, this front answers the error and goes on reading, so one bad observation
never costs a robot its connection.

Each observation becomes ONE native group on the scheduler's request socket (one shared
`AsyncClient`, many groups in flight), so robots connected at the same time are co-batched by the
scheduler. A robot that disconnects mid-call has its group cancelled (control socket).

Authentication (`FrontConfig.tokens`, the front's `--tokens DIR`): the websocket handshake must carry
`Authorization: Bearer <token>` (or openpi-client's `api_key`: `Authorization: Api-Key <token>`) whose
hash is in the key directory's `authorized_tokens/`; checked in `process_request`, before the upgrade,
so a missing or unknown token is an HTTP 401 with a one-line body and nothing reaches the scheduler.
When the front reaches the scheduler with CURVE keys (`FrontConfig.keys`: a proxy principal), each
observation of an authenticated connection is submitted on behalf of the token's principal, so its
tenant's limits and fair share apply and it may cancel and query those groups too. Without keys (a
scheduler on loopback, which names every local caller its admin and knows no principals) the groups are
the front's own; the token still decides who gets in. `GET /healthz` needs no token. Without tokens
the front listens off loopback only when told so (`FrontConfig.insecure`, the command line's --insecure).
With `FrontConfig.tls` (the front's `--tls-cert` and `--tls-key`) it serves wss:// and https:// only,
so a token does not cross the network in the clear (service/tls.py).

Frame limits: frames up to `max_frame_bytes` are read; over it, up to twice that, the frame is read
and refused with a text frame (the connection stays); past twice that, the websocket library closes
the connection with 1009 (message too big) before buffering it, which is all RFC 6455 allows.

Connection limit (`max_connections`): each open connection can hold a few frames of up to twice
`max_frame_bytes` (the one being answered, one queued, one being read), so without a limit the robots
connected decide the front's memory. A handshake past the limit is an HTTP 503 with `Retry-After`
(openpi's client raises with the body); handshakes that pass the check together and end past the limit
are closed at once with 1013 (try again later), so the limit holds exactly.
"""

from __future__ import annotations

import asyncio
import collections
import http
import itertools
import logging
import ssl
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import websockets
import websockets.asyncio.server
from websockets.protocol import State

from candidate_scheduler import convert, protocol
from candidate_scheduler.core import reducers
from candidate_scheduler.core.access import FORBIDDEN, Principal, Role
from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import ClientClosed, SchedulerUnavailable, ServiceError
from candidate_scheduler.service.endpoints import is_loopback_host
from candidate_scheduler.service.keys import ClientKeys, Directory, authenticate, redact_credentials_in
from candidate_scheduler.service.openpi import msgpack_numpy, observation

log = logging.getLogger("candidate_scheduler.service.openpi")

READY_PREFIX = "candidate-scheduler openpi front: listening on"
DEFAULT_MAX_FRAME_BYTES = protocol.MAX_OBSERVATION_BYTES
STATS_TIMEOUT_S = 1.0
DEFAULT_MAX_CONNECTIONS = 256  # robots per front; a connection may hold ~3 frames (module docstring)
FULL_RETRY_AFTER_S = 1  # what a refused robot is told to wait before it connects again
# refusals are logged at most once this often: a robot retrying in a loop, or a stranger, floods nothing
FULL_LOG_EVERY_S = 10.0
STATS_CACHE_S = 2.0
MAX_ERROR_CHARS = 2000  # an error frame quotes what was sent, and that can be most of a 32 MiB frame
CANCEL_DRAIN_S = 1.5  # how long close waits for the cancels of abandoned groups still being sent
WEBSOCKETS_LOGGER = "websockets.server"  # the library's default, named so the redaction covers what it logs
CANCEL_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # waits before asking again for a group the scheduler has not seen


@dataclass
class FrontConfig:
    scheduler_request: str
    scheduler_control: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    defaults: observation.FrontDefaults = field(default_factory=observation.FrontDefaults)
    model_name: str = "cosmos3"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # open websocket connections at once
    request_timeout_s: float | None = None
    tokens: Directory | None = None  # bearer tokens every connection needs (None: no authentication)
    keys: ClientKeys | None = None  # this front's CURVE keys, for a scheduler that requires them
    insecure: bool = False  # the user said --insecure: a bind off loopback without tokens is allowed
    tls: ssl.SSLContext | None = None  # serve wss:// (service/tls.py: server_context); None: ws://
    # a call the scheduler did not run because it was stopping goes to its next run (the robot sees a slower
    # answer across an upgrade, not an error); off in a front that stops with its scheduler (`serve --openpi-port`)
    resubmit: bool = True


# ---- bearer tokens (shared with compat/http.py) ---------------------------------------------------------

class _Refusal(Exception):
    """An observation answered with a text frame; `kind` is a short label for the stats."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class OpenpiFront:
    def __init__(self, config: FrontConfig):
        self.config = config
        self.stats: collections.Counter = collections.Counter()  # event tallies, for logs and tests
        self.client = AsyncClient(config.scheduler_request, keys=config.keys, control=config.scheduler_control)
        self.control = self.client.control  # STATS for the metadata, CANCEL for abandoned groups
        self._server: websockets.asyncio.server.Server | None = None
        self._stats_cache: tuple[float, dict] | None = None
        self._stats_ask: asyncio.Future | None = None  # the STATS in flight, shared by every connection
        self._cancels: set[asyncio.Task] = set()  # CANCELs of abandoned groups (robot left, timed out) in flight
        self._conn_ids = itertools.count(1)
        self.live = 0  # connections whose handler runs (past the handshake, not yet closed)
        self._full_logged = -FULL_LOG_EVERY_S  # when a refusal for a full front was last logged
        self._unauthorized_logged = -FULL_LOG_EVERY_S  # when a refusal for a token was last logged
        self.url: str | None = None

    # ---- the server -------------------------------------------------------------------------------
    async def start(self) -> str:
        """Listen; ValueError (nothing listens) for a bind off loopback without tokens unless
        `FrontConfig.insecure`: the command line's rule (launch.bind_refusal), for callers from Python too."""
        cfg = self.config
        if cfg.tokens is None and not cfg.insecure and not is_loopback_host(cfg.host):
            raise ValueError(f"refusing to serve the openpi websocket on {cfg.host!r} without tokens: pass "
                             "FrontConfig(tokens=load_tokens(DIR)), bind loopback, or insecure=True to let anyone "
                             "who reaches it submit work")
        redact_credentials_in(WEBSOCKETS_LOGGER)  # it logs each handshake header, the token too, at DEBUG
        self._server = await websockets.asyncio.server.serve(
            self._handler, cfg.host, cfg.port,
            compression=None,  # as openpi's server and client: arrays do not compress
            max_size=2 * cfg.max_frame_bytes,
            # a robot sends one observation and waits for its answer: one frame queued behind the one being
            # answered is all it ever needs, and each frame queued is memory (up to 2 x max_frame_bytes)
            max_queue=1,
            process_request=self._process_request,
            logger=logging.getLogger(WEBSOCKETS_LOGGER),
            ssl=cfg.tls,
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"{'wss' if cfg.tls is not None else 'ws'}://{_url_host(host)}:{port}"
        return self.url

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        try:
            await self._server.serve_forever()
        except asyncio.CancelledError:
            pass

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._cancels:
            # the link sends one at a time and waits out an absent scheduler's timeout for each: bounded here
            _, unsent = await asyncio.wait(set(self._cancels), timeout=CANCEL_DRAIN_S)
            for task in unsent:
                task.cancel()
            if unsent:
                await asyncio.wait(unsent)
                log.warning("closing: gave up cancelling %d abandoned groups (the scheduler did not answer in time)",
                            len(unsent))
        if self._stats_ask is not None:
            self._stats_ask.cancel()
        self.client.close()  # and its control link

    # ---- metadata ---------------------------------------------------------------------------------
    async def _scheduler_info(self) -> dict[str, Any]:
        if self.control is None:
            return {}
        if self._stats_cache is not None and time.monotonic() - self._stats_cache[0] < STATS_CACHE_S:
            return self._stats_cache[1]
        # One ask for every robot connecting meanwhile: the control link asks one at a time, so with the
        # scheduler away each ask waits its full timeout and the Nth robot waited N of them for metadata.
        if self._stats_ask is None or self._stats_ask.done():
            self._stats_ask = asyncio.ensure_future(self._ask_stats())
        return await asyncio.shield(self._stats_ask)

    async def _ask_stats(self) -> dict[str, Any]:
        now = time.monotonic()
        reply = await self.control.ask(protocol.Kind.STATS, protocol.Empty(), STATS_TIMEOUT_S)
        if reply is not None and not reply.ok and reply.error_code == FORBIDDEN:
            info = {"reachable": True}  # it answered, but this front's key may not read its stats
        elif reply is None or not reply.ok:
            info = {"reachable": False}
        else:
            workers = reply.detail.get("workers", {}) or {}
            capacities = [w.get("capacity") for w in workers.values() if isinstance(w, dict)]
            info = {"reachable": True, "workers": len(workers),
                    "max_candidates_per_batch": min((c for c in capacities if isinstance(c, int)), default=None)}
            if isinstance(reply.detail.get("capability"), dict):
                info["capability"] = reply.detail["capability"]
        self._stats_cache = (now, info)
        return info

    async def metadata(self) -> dict[str, Any]:
        d = self.config.defaults
        sampling = d.full_sampling()
        # the width the actions will have: raw_action_dim / domain_id unset mean "resolve as sglang does"
        resolved = convert.sampling_from_wire(observation.sampling_msg(d.sampling, {}))
        candidates = d.full_candidates()
        scheduler = await self._scheduler_info()
        capability = scheduler.get("capability", {})
        return {
            "server": "candidate_scheduler openpi front",
            "model": capability.get("model_name", self.config.model_name),
            "action_horizon": resolved.horizon,
            "action_dim": resolved.raw_action_dim,
            "action_shape": [resolved.horizon, resolved.raw_action_dim],
            "action_dtype": "float32",
            "candidates": {
                "max_count": int(capability.get("max_candidates_per_group", protocol.MAX_CANDIDATES)),
                "reducers": list(capability.get("reducers", reducers.registered_reducers())),
                "seed_policies": ["per_candidate", "offset", "explicit"],
                "return_candidates": True,
            },
            "defaults": {
                "seed": d.seed,  # None: a fresh random seed per call, reported in the reply
                "deadline_s": d.deadline_s,
                "prompt": d.prompt,
                "candidates": candidates,
                "sampling": sampling,
            },
            "observation": {
                "image_keys": [d.image_key] if d.image_key else [*observation.IMAGE_KEYS,
                                                                  observation.LEROBOT_IMAGE_PREFIX + "<name>"],
                "image_formats": ["uint8 [H, W, 3]", "uint8 [3, H, W]", f"float [H, W, 3] or [3, H, W] in [{d.float_range}]"],
                "reads": list(observation.READ_KEYS),
                "candidates_fields": list(observation.CANDIDATE_FIELDS),
                "sampling_fields": list(observation.SAMPLING_FIELDS),
                "ignored": "every other key, e.g. " + ", ".join(observation.KNOWN_IGNORED_KEYS),
                "ignored_keys": list(observation.KNOWN_IGNORED_KEYS),
            },
            "reply_keys": ["actions", "candidate_seeds", "seed", "served_count", "server_timing", "request_id",
                           "reducer", "scheduler_metrics", "candidates (when asked)", "chosen_candidate (medoid)",
                           "ignored_keys"],
            "max_frame_bytes": self.config.max_frame_bytes,
            "scheduler": {k: v for k, v in scheduler.items() if k != "capability"},
        }

    # ---- one connection ---------------------------------------------------------------------------
    async def _handler(self, ws: websockets.asyncio.server.ServerConnection) -> None:
        self.live += 1
        try:
            if self.live > self.config.max_connections:  # handshakes that passed the check together
                self._note_full(ws.remote_address)
                await ws.close(1013, "too many connections: try again later")
                return
            await self._serve_connection(ws)
        finally:
            self.live -= 1

    async def _serve_connection(self, ws: websockets.asyncio.server.ServerConnection) -> None:
        conn = next(self._conn_ids)
        self.stats["connections"] += 1
        principal: Principal | None = getattr(ws, "principal", None)  # set by _process_request
        log.info("connection %d from %s%s", conn, ws.remote_address,
                 "" if principal is None else f" ({principal.name}, tenant {principal.tenant})")
        prev_total_s = None
        calls = itertools.count(1)
        try:
            await ws.send(msgpack_numpy.packb(await self.metadata()))
            async for message in ws:
                started = time.monotonic()
                self.stats["calls"] += 1
                try:
                    answer = await self._answer(ws, message, f"openpi-{conn}-{next(calls)}-{uuid.uuid4().hex[:8]}",
                                                prev_total_s, principal)
                except _Refusal as exc:
                    self.stats[f"error:{exc.kind}"] += 1
                    await ws.send(_error_text(str(exc)))
                    prev_total_s = None
                    continue
                except websockets.ConnectionClosed:
                    raise
                except Exception as exc:  # noqa: BLE001 - a bug answers this call, never the connection
                    log.exception("openpi front failed on a call")
                    self.stats["error:internal"] += 1
                    await ws.send(_error_text(f"internal error: {type(exc).__name__}: {exc}"))
                    prev_total_s = None
                    continue
                await ws.send(answer)
                prev_total_s = time.monotonic() - started
        except websockets.ConnectionClosed:
            pass
        log.info("connection %d closed", conn)

    async def _answer(self, ws, message, request_id: str, prev_total_s: float | None,
                      principal: Principal | None = None) -> bytes:
        if isinstance(message, str):
            self.stats["refused"] += 1
            raise _Refusal("text_frame", "expected a binary msgpack-numpy frame (an observation dict), got a text frame")
        if len(message) > self.config.max_frame_bytes:
            self.stats["refused"] += 1
            raise _Refusal("oversize", f"frame of {len(message)} bytes is over this front's "
                                       f"{self.config.max_frame_bytes}-byte limit")
        try:
            # decoding and image conversion take milliseconds for big images: off the event loop
            call = await asyncio.to_thread(self._translate, message, request_id, principal)
        except msgpack_numpy.WireError as exc:
            self.stats["refused"] += 1
            raise _Refusal(exc.kind, str(exc)) from None
        except observation.ObservationError as exc:
            self.stats["refused"] += 1
            raise _Refusal("bad_observation", str(exc)) from None
        started = time.monotonic()
        result = await self._submit(ws, call)
        infer_s = time.monotonic() - started
        try:
            out = observation.reply(call, result, infer_s, prev_total_s)
        except observation.ResultError as exc:
            self.stats["failed"] += 1
            raise _Refusal(result.status, str(exc)) from None
        self.stats["done"] += 1
        return msgpack_numpy.packb(out)

    def _translate(self, message: bytes, request_id: str, principal: Principal | None = None) -> observation.Call:
        call = observation.translate(msgpack_numpy.unpackb(message), self.config.defaults, request_id)
        if principal is not None and self.config.keys is not None:
            # a scheduler that authenticates this front knows the token's principal: its tenant applies
            call = replace(call, submit=msgspec.structs.replace(call.submit, on_behalf=principal.name))
        return call

    async def _submit(self, ws, call: observation.Call):
        """The native result, or a _Refusal. Cancels the group when the robot goes away or the call
        times out."""
        rid = call.submit.request_id
        if ws.state is not State.OPEN:  # it left while the frame was decoded: nothing to send, nothing to cancel
            self.stats["left_before_submit"] += 1
            raise websockets.ConnectionClosedOK(None, None)
        submit = asyncio.ensure_future(self.client.submit_request(call.submit, resubmit=self.config.resubmit))
        closed = asyncio.ensure_future(ws.wait_closed())
        try:
            done, _ = await asyncio.wait({submit, closed}, timeout=self.config.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if submit in done:
            try:
                return submit.result()
            except ServiceError as exc:
                self.stats["failed"] += 1
                raise _Refusal("scheduler_error", f"the scheduler could not read the request: {exc}") from None
            except (SchedulerUnavailable, ClientClosed) as exc:  # not the front's fault: say what it is
                self.stats["failed"] += 1
                raise _Refusal("scheduler_unavailable", f"the scheduler is not available: {exc}") from None
            except ValueError as exc:  # submit_frames: over the native message limit (--max-frame-bytes past it)
                self.stats["refused"] += 1
                raise _Refusal("too_large", str(exc)) from None
        submit.cancel()
        # Not awaited: the control link asks one at a time and waits out an absent scheduler's timeout for each,
        # so awaited, the Nth robot timed out (or closed by a shutdown) at once waited N of them.
        task = asyncio.ensure_future(self._cancel_quietly(rid))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)
        if closed in done:
            self.stats["cancelled_on_disconnect"] += 1
            raise websockets.ConnectionClosedOK(None, None)
        self.stats["timeouts"] += 1
        raise _Refusal("timeout", f"no result within {self.config.request_timeout_s} s (cancelling group {rid})")

    async def _cancel(self, rid: str) -> protocol.ControlReply | None:
        if self.control is None:
            return None
        return await self.control.ask(protocol.Kind.CANCEL, protocol.CancelRequest(request_id=rid), STATS_TIMEOUT_S)

    async def _cancel_quietly(self, rid: str) -> None:
        try:
            for delay in (*CANCEL_RETRY_S, None):
                reply = await self._cancel(rid)
                # "unknown": the SUBMIT, sent first but on the request socket, may still be on its way (an image
                # takes longer to send than a CANCEL), and a group whose cancel came first would run unwanted
                if delay is None or reply is None or reply.state != "unknown":
                    return
                await asyncio.sleep(delay)
        except Exception:  # noqa: BLE001 - nobody awaits it: said here, not as an unretrieved task exception
            log.warning("could not cancel abandoned group %s", rid, exc_info=True)

    def _process_request(self, connection, request):
        """Before the upgrade: GET /healthz answers 200 without a websocket handshake, as openpi's server
        does; with tokens, a handshake without a known one is an HTTP 401 (one line, no traceback, nothing
        submitted). The principal rides on the connection to `_handler`."""
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        principal = None
        if self.config.tokens is not None:  # first: a caller without a token learns nothing, not even that we are full
            principal, why = authenticate(self.config.tokens, request.headers.get_all("Authorization"))
            if principal is None:
                self.stats["unauthorized"] += 1
                now = time.monotonic()
                # anyone who reaches the port can ask, without a token, thousands of times a second
                if now - self._unauthorized_logged >= FULL_LOG_EVERY_S:
                    self._unauthorized_logged = now
                    log.warning("refused a connection from %s: %s (%d refused for their token so far)",
                                connection.remote_address, why, self.stats["unauthorized"])
                response = connection.respond(http.HTTPStatus.UNAUTHORIZED, f"candidate_scheduler openpi: {why}\n")
                response.headers["WWW-Authenticate"] = 'Bearer realm="candidate_scheduler openpi"'
                return response
            if self.config.keys is not None and principal.role is not Role.CLIENT:
                # the front submits on behalf of the token's holder, and the scheduler acts only for clients:
                # every observation would come back forbidden, so the robot hears it now, in one line
                self.stats["forbidden"] += 1
                log.warning("refused a connection from %s: a %s token (%s)", connection.remote_address,
                            principal.role.value, principal.name)
                return connection.respond(
                    http.HTTPStatus.FORBIDDEN,
                    f"candidate_scheduler openpi: {principal.name}'s token is a {principal.role.value}'s; robots "
                    "submit with a client's token (`candidate-scheduler keys DIR --token NAME`)\n")
        if self.live >= self.config.max_connections:
            self._note_full(connection.remote_address)
            response = connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"candidate_scheduler openpi: too many connections ({self.config.max_connections} open, the front's "
                "--max-connections): try again later\n")
            response.headers["Retry-After"] = str(FULL_RETRY_AFTER_S)
            return response
        connection.principal = principal
        return None

    def _note_full(self, remote) -> None:
        self.stats["refused:full"] += 1
        now = time.monotonic()
        if now - self._full_logged >= FULL_LOG_EVERY_S:
            self._full_logged = now
            log.warning("refused a connection from %s: %d connections open, the limit (%d refused so far)",
                        remote, self.live, self.stats["refused:full"])


def _error_text(message: str) -> str:
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}... ({len(message) - MAX_ERROR_CHARS} more characters)"
    return f"candidate_scheduler openpi: {message}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
