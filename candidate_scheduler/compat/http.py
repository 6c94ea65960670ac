"""sglang's own FastAPI server, pointed at the compat bridge (this module imports sglang lazily).

``run_http_server`` starts sglang's HTTP-only server with the bridge as its scheduler, after
``install_http_shims`` puts three small wrappers into sglang's action endpoint (in that process only):
the request side carries ``parameters.candidates``, the response side labels candidate rows, and
``GET /v1/actions/metadata`` (and the metadata frame of the action websockets) declares what
candidate_scheduler serves. sglang's builder passes ``domain_name`` through unresolved; the bridge
resolves it (`core.embodiments`), and the request shim refuses an unknown one up front.

Bearer tokens (``run_http_server(..., tokens=Directory)``, `candidate-scheduler http --tokens DIR`):
`install_token_auth` wraps sglang's app in `TokenAuth`, so every HTTP route and websocket handshake
except ``GET /liveness`` and ``GET /health`` answers 401 (a JSON ``{"detail": ...}`` body, as FastAPI's
errors) without ``Authorization: Bearer <token>`` (or ``Api-Key <token>``) of the key directory.

Who the scheduler sees: this server talks to the compat bridge over sglang's own pickle socket, on
loopback, and the bridge is ONE principal for every HTTP client (the proxy key `serve` gives it, or the
local admin when the scheduler takes no keys). The token decides who gets in; it does not travel to the
scheduler, so every HTTP client's groups count against the bridge's tenant, not its token's.

sglang's offline broker (a pickle socket on port+1) does not start: see `install_no_offline_broker`."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import numpy as np

from candidate_scheduler import protocol
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.images import MAX_OBSERVATIONS
from candidate_scheduler.compat.mapping import CANDIDATE_SPEC_KEY, parse_candidate_spec
from candidate_scheduler.core.embodiments import EMBODIMENT_TO_DOMAIN_ID, resolve_embodiment
from candidate_scheduler.core.reducers import BUILTIN_REDUCERS
from candidate_scheduler.core.spec import SeedPolicy
from candidate_scheduler.service.endpoints import is_loopback_host

_SHIMS_INSTALLED = False
OPEN_PATHS = frozenset({"/liveness", "/health"})  # GET without a token: liveness and readiness probes


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


def install_http_shims() -> None:
    """Wrappers in sglang's action endpoint (this process only; idempotent):

    - request: ``parameters.candidates`` of ``POST /v1/actions/generations`` is copied into the
      sampling params' ``diffusers_kwargs["candidates"]``, which ``prepare_request`` copies into
      ``Req.extra["diffusers_kwargs"]`` (sglang's Cosmos3 builder drops unknown parameters); the
      embodiment fields are checked with `resolve_embodiment`, so an unknown ``domain_name`` is an
      HTTP 400 with sglang's wording (sglang itself fails it later, in its latent stage);
    - response: candidate rows get their ``candidate_index`` (sglang hard-codes 0), plus
      ``candidate_group`` and ``reduced_action`` (see `relabel_candidate_response`);
    - metadata: ``GET /v1/actions/metadata`` and the first frame of the action websockets come from
      `candidate_metadata` (sglang's says one candidate per request).
    """
    global _SHIMS_INSTALLED
    if _SHIMS_INSTALLED:
        return
    from sglang.multimodal_gen.runtime.entrypoints.action import api, ws_utils
    from sglang.multimodal_gen.runtime.entrypoints.action import protocol as action_protocol

    original_build = action_protocol.build_cosmos3_action_sampling_params
    original_response = api.action_generation_response
    original_raw = api.action_raw_response
    original_metadata = action_protocol.action_metadata

    def build_request(payload, observation, server_args, sampling_params_cls):
        sp = original_build(payload, observation, server_args, sampling_params_cls)
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

    action_protocol.build_cosmos3_action_sampling_params = build_request
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
        body = json.dumps({"detail": f"unauthorized: {why}"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"www-authenticate", b'Bearer realm="candidate_scheduler"')]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})  # policy violation: the server answers 403

    @staticmethod
    def _open(scope) -> bool:
        if scope["type"] != "http":
            return False
        method = scope.get("method", "GET")
        if method in ("GET", "HEAD") and scope.get("path") in OPEN_PATHS:
            return True
        headers = {k.lower() for k, _ in scope.get("headers", ())}
        return method == "OPTIONS" and b"origin" in headers and b"access-control-request-method" in headers


def install_token_auth(tokens) -> None:
    """`TokenAuth` around the app sglang's `launch_http_server_only` builds (this process only)."""
    from sglang.multimodal_gen.runtime import launch_server

    original = getattr(launch_server.create_app, "__wrapped__", launch_server.create_app)

    def create_app(*args, **kwargs):
        app = original(*args, **kwargs)
        app.add_middleware(TokenAuth, tokens=tokens)  # outermost: before sglang's own middleware
        return app

    create_app.__wrapped__ = original
    launch_server.create_app = create_app


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
                    *, tokens=None, insecure: bool = False, **server_kwargs: Any) -> None:
    """Run sglang's own FastAPI server (blocking) with the compat bridge as its scheduler, so
    ``POST /v1/actions/generations`` (and /v1/actions/metadata, the websocket) are served by
    candidate_scheduler. `tokens`: a key directory (`service.keys.Directory`) whose bearer tokens every
    route but the health probes requires (`TokenAuth`); None: no authentication, which off loopback
    needs `insecure` (ValueError otherwise, before anything listens: the CLI's rule, for callers from
    Python too). Extra keyword arguments go to sglang's ServerArgs (e.g. warmup_mode, batching_max_size)."""
    if tokens is None and not insecure and not is_loopback_host(host):
        raise ValueError(f"refusing to serve HTTP on {host} without tokens: pass tokens=Directory, bind loopback, "
                         "or insecure=True to let anyone who reaches it submit work")
    sa = make_http_server_args(compat_endpoint_port, model_dir, host, port, **server_kwargs)
    install_http_shims()
    install_no_offline_broker()
    if tokens is not None:
        install_token_auth(tokens)
    from sglang.multimodal_gen.runtime.launch_server import launch_http_server_only

    launch_http_server_only(sa)
