"""sglang's own FastAPI server, pointed at the compat bridge (this module imports sglang lazily).

``run_http_server`` starts sglang's HTTP-only server with the bridge as its scheduler, after
``install_http_shims`` puts small wrappers into sglang's action endpoint (in that process only):
the request side carries ``parameters.candidates``, the response side labels candidate rows,
``GET /v1/actions/metadata`` (and the metadata frame of the action websockets) declares what
candidate_scheduler serves, and what a caller sends is kept to data: no path on this host taken for an
image, uploads saved under plain names, no image decoded past the bridge's pixel limit. sglang's builder
passes ``domain_name`` through unresolved; the bridge resolves it (`core.embodiments`), and the request
shim refuses an unknown one up front.

Bearer tokens (``run_http_server(..., tokens=Directory)``, `candidate-scheduler http --tokens DIR`):
`install_app_guards` wraps sglang's app in `TokenAuth`, so every HTTP route and websocket handshake
except ``GET /liveness`` and ``GET /health`` answers 401 (a JSON ``{"detail": ...}`` body, as FastAPI's
errors) without ``Authorization: Bearer <token>`` (or ``Api-Key <token>``) of the key directory.

Routes: only what candidate_scheduler serves (`SERVED_PATHS`: the action API and its websockets, the probes,
model discovery, metrics) reaches sglang's app; its image, video, mesh, LoRA, weight and rollout routes
answer 404 (`ServedRoutes`, with or without tokens): the bridge serves none of them, and some fetch a
caller's URL from the server before they ask it.

Who the scheduler sees: this server talks to the compat bridge over sglang's own pickle socket, on
loopback, and the bridge is ONE principal for every HTTP client (the proxy key `serve` gives it, or the
local admin when the scheduler takes no keys). The token decides who gets in; it does not travel to the
scheduler, so every HTTP client's groups count against the bridge's tenant, not its token's.

sglang's offline broker (a pickle socket on port+1) does not start: see `install_no_offline_broker`."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import re
from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.header_timeout import DEFAULT_HEADER_TIMEOUT_S, protocol_class
from candidate_scheduler.compat.images import IMAGE_FORMATS, MAX_OBSERVATIONS
from candidate_scheduler.compat.mapping import CANDIDATE_SPEC_KEY, parse_candidate_spec
from candidate_scheduler.compat.unpickle import MAX_IMAGE_PIXELS
from candidate_scheduler.core.embodiments import EMBODIMENT_TO_DOMAIN_ID, resolve_embodiment
from candidate_scheduler.core.reducers import BUILTIN_REDUCERS
from candidate_scheduler.core.spec import SeedPolicy
from candidate_scheduler.service.endpoints import is_loopback_host
from candidate_scheduler.service.tls import server_context

_SHIMS_INSTALLED = False
OPEN_PATHS = frozenset({"/liveness", "/health"})  # GET without a token: liveness and readiness probes
# What this server serves (`ServedRoutes`): the action API (HTTP, its websocket, sglang's openpi websocket),
# the probes, model discovery and metrics. sglang's image, video, mesh, LoRA, weight and rollout routes are
# answered by nothing behind the bridge, and some work before they ask it: /v1/images/edits and /v1/videos
# download a caller's URL, redirects followed, and say what they met (a request forger into our network).
SERVED_PATHS = frozenset({*OPEN_PATHS, "/models", "/model_info", "/v1/models", "/v1/model_info",
                          "/v1/actions/generations", "/v1/actions/metadata", "/v1/actions/realtime",
                          "/openpi/policy", "/metrics"})
SERVED_PREFIXES = ("/v1/models/",)  # /v1/models/{model}
# sglang reads a body whole (request.json()). The largest the bridge takes is one group's observations,
# MAX_OBSERVATION_BYTES of uint8, which as JSON pixel lists ("255, ") is at most 5 bytes a value: 8x is room.
MAX_BODY_BYTES = 8 * protocol.MAX_OBSERVATION_BYTES


def _action_value(values: Any, preserve_numpy: bool) -> dict[str, Any]:
    arr = np.asarray(values, dtype=np.float32)
    return {"type": "continuous", "dtype": "float32", "shape": list(arr.shape),
            "values": arr if preserve_numpy else arr.tolist()}


def relabel_candidate_response(output: dict[str, Any], response: dict[str, Any], *,
                               preserve_numpy: bool = False) -> dict[str, Any]:
    """Candidate labels for sglang's action envelope. sglang's `action_generation_response` numbers
    every row of ``actions`` as an input with ``candidate_index`` 0; for a candidate group the rows are
    candidates (candidate-major when there are several inputs). Adds ``candidate_group`` and, when
    candidates are listed, the served ``reduced_action``."""
    group = output.get("candidate_group") if isinstance(output, dict) else None
    if not isinstance(group, dict):
        return response
    inputs = int(group.get("num_inputs") or 1)
    if group.get("return_candidates"):
        for k, entry in enumerate(response.get("data", [])):
            entry["candidate_index"] = k // inputs
            entry["input_index"] = k % inputs
            entry["index"] = k
        reduced = output.get("reduced_actions")
        response["reduced_action"] = None if reduced is None else _action_value(reduced, preserve_numpy)
    response["candidate_group"] = {k: v for k, v in group.items() if k != "num_inputs"}
    response["served_count"] = group.get("served_count", group.get("count"))
    response.setdefault("usage", {})["num_candidates"] = response["served_count"]
    return response


def max_batch_inputs(batching_max_size: Any) -> int:
    """Observations one HTTP request may carry: sglang's builder refuses more than
    ``--batching-max-size``, the bridge more than a group's limit."""
    return max(1, min(int(batching_max_size or 1), MAX_OBSERVATIONS))


def candidate_metadata(metadata: dict[str, Any], batching_max_size: Any) -> dict[str, Any]:
    """sglang's Cosmos3 action metadata, corrected to what this server does: several candidates per
    request (count, reducers, seed policies), batched observations up to `max_batch_inputs`, the
    policy mode only (the bridge refuses inverse_dynamics and video inputs), and the domain names
    it resolves."""
    max_batch = max_batch_inputs(batching_max_size)
    capabilities = dict(metadata.get("capabilities") or {})
    capabilities.update({
        "action_modes": ["policy"],
        "batch_inputs": max_batch > 1,
        "max_batch_size": max_batch,
        "batched_action_modes": ["policy"],
        "multiple_candidates": True,
        "max_candidates": protocol.MAX_CANDIDATES,
        "candidate_reducers": list(BUILTIN_REDUCERS),
        "candidate_seed_policies": [p.value for p in SeedPolicy],
        "candidate_parameter": f"parameters.{CANDIDATE_SPEC_KEY}",
    })
    inputs = dict(metadata.get("input") or {})
    inputs["modalities"] = ["image"]
    inputs["domain_names"] = sorted(EMBODIMENT_TO_DOMAIN_ID)
    defaults = dict(metadata.get("defaults") or {})
    defaults["action_mode"] = "policy"
    return {**metadata, "scheduler": "candidate_scheduler", "input": inputs, "defaults": defaults,
            "capabilities": capabilities}


# The uploads the request being built saved (its own task's context): the only paths it may hand the bridge.
_UPLOADED: contextvars.ContextVar[frozenset] = contextvars.ContextVar("candidate_scheduler_uploads",
                                                                       default=frozenset())


def refuse_server_paths(image_path: Any) -> None:
    """ValueError (sglang's HTTP 400) for an observation image that is a path on this host, but for the
    uploads this request saved. The bridge reads local paths (sglang's offline clients send them), so a
    caller's string would have the server open its files, and say which exist, which it may read and
    which are images; ``data:`` URLs are data, and http(s) URLs the bridge refuses itself."""
    items = image_path if isinstance(image_path, (list, tuple)) else [image_path]
    uploaded = _UPLOADED.get()
    for item in items:
        if isinstance(item, str) and not item.startswith(("data:", "http://", "https://")) and item not in uploaded:
            raise ValueError("observation images are sent as data (b64_json, a data: URL, pixel arrays) or "
                             "uploaded (multipart); a path on the server is not read")


def check_image_header(payload: dict) -> None:
    """ValueError (HTTP 400) for a ``b64_json`` image over the bridge's pixel limit, read from its header.
    sglang decodes it in this process (RGB, then a copy) up to PIL's ~179 M-pixel bomb limit: ~1 GB from
    a body of about a MB, which the bridge then refuses. What cannot be read is left to sglang to say."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    data = payload.get("b64_json") or payload.get("base64")
    if isinstance(data, str) and data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    try:
        # the header only, nothing decoded yet; of the formats the bridge reads (any other, sglang's to refuse)
        with Image.open(io.BytesIO(base64.b64decode(data)), formats=IMAGE_FORMATS) as image:
            width, height = image.size
    except Image.DecompressionBombError as exc:  # PIL's own limit, far past ours: not sglang's 500
        raise ValueError(f"observation image: {exc}") from None
    except (TypeError, ValueError, binascii.Error, UnidentifiedImageError, OSError):
        return
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"observation image of {width}x{height} pixels is over the {MAX_IMAGE_PIXELS}-pixel limit")


def install_http_shims() -> None:
    """Wrappers in sglang's action endpoint (this process only; idempotent):

    - request: ``parameters.candidates`` of ``POST /v1/actions/generations`` is copied into the
      sampling params' ``diffusers_kwargs["candidates"]``, which ``prepare_request`` copies into
      ``Req.extra["diffusers_kwargs"]`` (sglang's Cosmos3 builder drops unknown parameters); the
      embodiment fields are checked with `resolve_embodiment`, so an unknown ``domain_name`` is an
      HTTP 400 with sglang's wording (sglang itself fails it later, in its latent stage); an image given
      as a path on this host is a 400 too (`refuse_server_paths`), as is a ``b64_json`` image over the
      bridge's pixel limit, before sglang decodes it (`check_image_header`);
    - response: candidate rows get their ``candidate_index`` (sglang hard-codes 0), plus
      ``candidate_group`` and ``reduced_action`` (see `relabel_candidate_response`);
    - metadata: ``GET /v1/actions/metadata`` and the first frame of the action websockets come from
      `candidate_metadata` (sglang's says one candidate per request);
    - uploads: a multipart upload of ``POST /v1/actions/generations`` is saved under a plain name inside
      the uploads directory (sglang joined the caller's request id and file name into the path).
    """
    global _SHIMS_INSTALLED
    if _SHIMS_INSTALLED:
        return
    from sglang.multimodal_gen.runtime.entrypoints.action import api, ws_utils
    from sglang.multimodal_gen.runtime.entrypoints.action import protocol as action_protocol
    from sglang.multimodal_gen.runtime.entrypoints.openai.utils import sanitize_upload_filename, save_image_to_path

    original_build = action_protocol.build_cosmos3_action_sampling_params
    original_response = api.action_generation_response
    original_raw = api.action_raw_response
    original_metadata = action_protocol.action_metadata

    def build_request(payload, observation, server_args, sampling_params_cls):
        sp = original_build(payload, observation, server_args, sampling_params_cls)
        refuse_server_paths(sp.image_path)
        # an unknown domain name is the client's mistake: a ValueError is sglang's HTTP 400
        resolve_embodiment(sp.domain_id, sp.domain_name, sp.raw_action_dim)
        parameters = payload.get("parameters") or {}
        raw = parameters.get(CANDIDATE_SPEC_KEY)
        if raw is not None:
            try:
                spec = parse_candidate_spec(raw)
            except CompatError as exc:
                raise ValueError(str(exc)) from None  # sglang answers ValueError with HTTP 400
            sp.diffusers_kwargs = {**(sp.diffusers_kwargs or {}), CANDIDATE_SPEC_KEY: spec.to_dict()}
        return sp

    def generation_response(output, server_args, *, preserve_numpy=False):
        response = original_response(output, server_args, preserve_numpy=preserve_numpy)
        return relabel_candidate_response(output, response, preserve_numpy=preserve_numpy)

    def raw_response(output, *, preserve_numpy=False):
        response = original_raw(output, preserve_numpy=preserve_numpy)
        reduced = response.get("reduced_actions")
        if isinstance(reduced, np.ndarray) and not preserve_numpy:
            response["reduced_actions"] = reduced.tolist()
        return response

    def metadata(server_args):
        return candidate_metadata(original_metadata(server_args), getattr(server_args, "batching_max_size", 1))

    async def save_action_upload(upload, request_id, uploads_dir, *, fallback_name):
        # sglang saves a multipart upload as os.path.join(uploads_dir, f"{request_id}_{filename}"), both the
        # caller's and making directories on the way: "/x" or "../" in either wrote the caller's bytes
        # wherever this server's user may write. Both are reduced to plain names, kept under uploads_dir.
        name = sanitize_upload_filename(str(getattr(upload, "filename", None) or ""), fallback_name)
        rid = re.sub(r"[^A-Za-z0-9._-]+", "_", str(request_id)).strip("._")[:64] or "upload"
        path = await save_image_to_path(upload, os.path.join(uploads_dir, f"{rid}_{name}"), uploads_root=uploads_dir)
        _UPLOADED.set(_UPLOADED.get() | {path})  # this request's: its image_path may name it
        return path

    original_decode = action_protocol._decode_b64_image

    def decode_b64_image(payload):
        check_image_header(payload)
        return original_decode(payload)

    action_protocol.build_cosmos3_action_sampling_params = build_request
    action_protocol._decode_b64_image = decode_b64_image
    api._save_action_upload = save_action_upload
    api.action_generation_response = generation_response
    api.action_raw_response = raw_response
    # api and ws_utils imported the function by name: replace every binding
    action_protocol.action_metadata = metadata
    api.action_metadata = metadata
    ws_utils.action_metadata = metadata
    _SHIMS_INSTALLED = True


class TokenAuth:
    """ASGI middleware: a request (or websocket handshake) needs a bearer token of `tokens`
    (`Directory.for_token`), except GET/HEAD of `OPEN_PATHS` and CORS preflights (sglang's CORS
    middleware answers those itself, without running a route). Refused: HTTP 401, ``{"detail": why}``."""

    def __init__(self, app, tokens):
        self.app, self.tokens = app, tokens

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._open(scope):
            return await self.app(scope, receive, send)
        from candidate_scheduler.service.keys import authenticate

        values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        principal, why = authenticate(self.tokens, values)
        if principal is not None:
            scope.setdefault("state", {})["principal"] = principal  # request.state.principal
            return await self.app(scope, receive, send)
        await _refuse(scope, receive, send, 401, f"unauthorized: {why}",
                      [(b"www-authenticate", b'Bearer realm="candidate_scheduler"')])

    @staticmethod
    def _open(scope) -> bool:
        if scope["type"] != "http":
            return False
        method = scope.get("method", "GET")
        if method in ("GET", "HEAD") and scope.get("path") in OPEN_PATHS:
            return True
        headers = {k.lower() for k, _ in scope.get("headers", ())}
        return method == "OPTIONS" and b"origin" in headers and b"access-control-request-method" in headers


def keep_tokens_out_of_logs() -> None:
    """uvicorn's websocket protocol logs each handshake header on "uvicorn.error" at DEBUG (sglang's
    ``--log-level debug``), the bearer token too: its value is redacted there (idempotent)."""
    from candidate_scheduler.service.keys import redact_credentials_in

    redact_credentials_in("uvicorn.error")


class _BodyTooLarge(Exception):
    pass


class ServedRoutes:
    """ASGI middleware: a request or websocket handshake for a path this server does not serve
    (`SERVED_PATHS`) is answered 404 before any of sglang's code runs, and a request body over
    `MAX_BODY_BYTES` 413: on its Content-Length, or once that much of it is read."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if path not in SERVED_PATHS and not path.startswith(SERVED_PREFIXES):
            return await _refuse(scope, receive, send, 404, "Not Found")
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = MAX_BODY_BYTES
        too_large = f"the request body is over this server's {limit}-byte limit"
        declared = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
        if any(not v.strip().isdigit() or int(v) > limit for v in declared):
            return await _refuse(scope, receive, send, 413, too_large)
        read, started = 0, False

        async def capped_receive():
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:
                    raise _BodyTooLarge
            return message

        async def noting_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, noting_send)
        except Exception as exc:  # sglang's BaseHTTPMiddleware hands it up inside an ExceptionGroup
            over = isinstance(exc, _BodyTooLarge) or (isinstance(exc, BaseExceptionGroup)
                                                      and exc.subgroup(_BodyTooLarge) is not None)
            if not over or started:
                raise
            await _refuse(scope, receive, send, 413, too_large)


async def _refuse(scope, receive, send, status: int, detail: str, headers: list | None = None) -> None:
    """Answer `status` with ``{"detail": detail}`` (FastAPI's error body), to a request or a websocket
    handshake, without running the app."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *(headers or ())]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})  # policy violation: the server answers 403


def install_app_guards(tokens=None) -> None:
    """Around the app sglang's `launch_http_server_only` builds (this process only): `ServedRoutes`, and
    with `tokens` (a key directory) `TokenAuth` outside it, the tokens kept out of the debug log
    (`keep_tokens_out_of_logs`)."""
    from sglang.multimodal_gen.runtime import launch_server

    if tokens is not None:
        keep_tokens_out_of_logs()
    original = getattr(launch_server.create_app, "__wrapped__", launch_server.create_app)

    def create_app(*args, **kwargs):
        app = original(*args, **kwargs)
        app.add_middleware(ServedRoutes)
        if tokens is not None:
            app.add_middleware(TokenAuth, tokens=tokens)  # outermost: before sglang's own middleware
        return app

    create_app.__wrapped__ = original
    launch_server.create_app = create_app


def install_uvicorn_options(**options: Any) -> None:
    """sglang's `launch_http_server_only` calls `uvicorn.run(app, ...)` with a fixed set of options: add
    `options` (the protocol with a header timeout, TLS files) to that call (this process only;
    installing again replaces them)."""
    from sglang.multimodal_gen.runtime import launch_server

    uvicorn = launch_server.uvicorn
    original = getattr(uvicorn.run, "__wrapped__", uvicorn.run)

    def run(app, **kwargs):
        return original(app, **{**kwargs, **options})

    run.__wrapped__ = original
    uvicorn.run = run


def install_no_offline_broker() -> None:
    """Keep sglang's "offline broker" from starting (this process only; idempotent). sglang's HTTP server
    also binds a REP socket on 127.0.0.1:port+1 that ``pickle.loads`` whatever a local process sends (any
    local user could run code in this server), and when port+1 is taken the broker dies and ``/health``
    answers 503 for good. No sglang 0.5.23 client uses it; offline clients reach the compat endpoint,
    which decodes with the allow-list. The stand-in stays pending because sglang reads a finished broker
    task as a failed server."""
    from sglang.multimodal_gen.runtime.entrypoints import http_server

    async def no_broker(server_args) -> None:
        await asyncio.Event().wait()

    http_server.run_zeromq_broker = no_broker


def make_http_server_args(compat_endpoint_port: int, model_dir: str, host: str = "127.0.0.1", port: int = 30000,
                          **server_kwargs: Any):
    """sglang ServerArgs for an HTTP-only server whose scheduler is the compat bridge on
    tcp://127.0.0.1:`compat_endpoint_port`. ``batching_max_size`` defaults to a group's observation
    limit, so batched observations are accepted by sglang's request builder (sglang's default is 1)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")
    from sglang.multimodal_gen.runtime.server_args import ServerArgs

    model_dir = os.path.abspath(str(model_dir))
    server_kwargs.setdefault("attention_backend", "torch_sdpa")
    server_kwargs.setdefault("batching_max_size", MAX_OBSERVATIONS)
    sa = ServerArgs.from_kwargs(model_path=model_dir, host=host, port=int(port), **server_kwargs)
    # After construction: port settling would otherwise move an occupied (the bridge's!) port.
    sa.scheduler_ports = [int(compat_endpoint_port)]
    stats = os.path.join(model_dir, "action_stats.json")
    if os.path.exists(stats) and getattr(sa.pipeline_config, "action_stats_path", None) is None:
        sa.pipeline_config.action_stats_path = stats
    endpoint = f"tcp://127.0.0.1:{int(compat_endpoint_port)}"
    if sa.scheduler_endpoint != endpoint:
        # sglang derives the scheduler host from the public --host when it is a concrete address; the
        # bridge listens on loopback, so pin the internal hop there.
        sa.scheduler_endpoint_for = lambda replica=0: endpoint  # type: ignore[method-assign]
    return sa


def run_http_server(compat_endpoint_port: int, model_dir: str, host: str = "127.0.0.1", port: int = 30000,
                    *, tokens=None, insecure: bool = False, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                    tls: tuple[str, str] | None = None, **server_kwargs: Any) -> None:
    """Run sglang's own FastAPI server (blocking) with the compat bridge as its scheduler, so
    ``POST /v1/actions/generations`` (and /v1/actions/metadata, the websocket) are served by
    candidate_scheduler. `tokens`: a key directory (`service.keys.Directory`) whose bearer tokens every
    route but the health probes requires (`TokenAuth`); None: no authentication, which off loopback
    needs `insecure` (ValueError otherwise, before anything listens: the CLI's rule, for callers from
    Python too). `header_timeout_s`: a connection that has not sent a request's whole head that long after
    it opened, or after its last response, is closed (compat/header_timeout.py). `tls`: (certificate,
    key) PEM files to serve https:// and wss:// only (read here first: TlsError, one line, before
    anything listens; service/tls.py). Extra keyword arguments go to sglang's ServerArgs (e.g.
    warmup_mode, batching_max_size)."""
    if tokens is None and not insecure and not is_loopback_host(host):
        raise ValueError(f"refusing to serve HTTP on {host} without tokens: pass tokens=Directory, bind loopback, "
                         "or insecure=True to let anyone who reaches it submit work")
    options: dict[str, Any] = {"http": protocol_class(header_timeout_s)}
    if tls is not None:
        server_context(*tls)  # a wrong file is one line now, not uvicorn's traceback after sglang's start-up
        options.update(ssl_certfile=tls[0], ssl_keyfile=tls[1])
    sa = make_http_server_args(compat_endpoint_port, model_dir, host, port, **server_kwargs)
    install_http_shims()
    install_no_offline_broker()
    install_app_guards(tokens)
    install_uvicorn_options(**options)
    from sglang.multimodal_gen.runtime.launch_server import launch_http_server_only

    launch_http_server_only(sa)
