"""`candidate-scheduler http` answers only the routes candidate_scheduler serves.

sglang's app also carries its image, video, mesh, LoRA, weight and rollout routes. The compat bridge
answers none of them, but some do their work before they ask it: `POST /v1/images/edits` with a `url`
(and `/v1/videos` with a `reference_url`) downloads that URL from the server, following redirects, and
says in its 400 what the download met. Anyone who may call the HTTP server (every token holder; anyone
on the host on loopback) could so make it send GETs into its own network (cloud metadata, internal
admin ports) and read back whether something answers there. Those routes now answer 404 before any
of sglang's code runs; the action API, the health probes and model discovery stay."""

from __future__ import annotations

import http.server
import threading

import pytest

pytest.importorskip("sglang.multimodal_gen.runtime.launch_server")


@pytest.fixture
def probe():
    """A server inside "the network": the paths it was asked for."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def app(model_dir, monkeypatch, tmp_path):
    """sglang's app as `run_http_server` builds it (`launch_server.create_app`), without uvicorn."""
    from sglang.multimodal_gen.runtime import launch_server
    from sglang.multimodal_gen.runtime.server_args import server_args as sglang_server_args

    from candidate_scheduler.compat import http as compat_http
    from candidate_scheduler.service import keys

    monkeypatch.chdir(tmp_path)  # sglang saves uploads under ./inputs/uploads: here, not in the checkout
    monkeypatch.setattr(launch_server, "create_app", launch_server.create_app)  # given back after the test
    monkeypatch.setattr(sglang_server_args, "_global_server_args", sglang_server_args._global_server_args)
    keys.init_dir(tmp_path)
    token = keys.add_token(tmp_path, "web")
    sa = compat_http.make_http_server_args(1, str(model_dir))
    sglang_server_args.set_global_server_args(sa)  # as launch_http_server_only does before create_app
    compat_http.install_http_shims()
    compat_http.install_app_guards(keys.load_tokens(str(tmp_path)))  # what run_http_server does with --tokens
    return launch_server.create_app(sa), {"Authorization": f"Bearer {token}"}


@pytest.fixture
def forwarded(monkeypatch) -> list:
    """What reached the bridge: the scheduler client's `forward`, which records and answers 400 ("forwarded")."""
    from sglang.multimodal_gen.runtime.entrypoints.action import protocol as action_protocol

    seen: list = []

    async def forward(req, *args, **kwargs):
        seen.append(req)
        raise ValueError("forwarded")  # sglang answers a ValueError with HTTP 400

    monkeypatch.setattr(action_protocol.async_scheduler_client, "forward", forward)
    return seen


def test_a_token_holder_cannot_make_the_server_fetch_a_url(app, probe):
    from starlette.testclient import TestClient

    asgi, auth = app
    base, hits = probe
    client = TestClient(asgi)
    edits = client.post("/v1/images/edits", data={"prompt": "p", "url": f"{base}/latest/meta-data/"}, headers=auth)
    videos = client.post("/v1/videos", data={"prompt": "p", "reference_url": f"{base}/admin"}, headers=auth)
    assert hits == []  # before: ['/latest/meta-data/', ...], and the 400 said what the GET met
    assert (edits.status_code, videos.status_code) == (404, 404)


def test_the_action_api_and_the_probes_stay(app):
    from starlette.testclient import TestClient

    asgi, auth = app
    client = TestClient(asgi)
    assert client.get("/liveness").status_code == 200  # no token: a probe
    assert client.get("/v1/actions/metadata").status_code == 401  # no token
    meta = client.get("/v1/actions/metadata", headers=auth)
    assert meta.status_code == 200 and meta.json()["scheduler"] == "candidate_scheduler"
    assert client.get("/v1/models", headers=auth).status_code == 200
    # what is not served says so, with or without a token (a caller without one learns no more than 401)
    assert client.post("/update_weights_from_disk", json={"model_path": "/tmp"}, headers=auth).status_code == 404
    assert client.post("/v1/set_lora", json={}, headers=auth).status_code == 404
    assert client.get("/v1/videos", headers=auth).status_code == 404


# ---- the action API's multipart uploads --------------------------------------------------------------------


@pytest.mark.parametrize("request_id, filename", [
    ("{outside}/planted", "obs.png"),  # an absolute request id: os.path.join drops the uploads directory
    ("x", "/../../../../../../../../{outside}/planted.png"),  # a file name that climbs out of it
    ("../../../../../../../../{outside}/planted", "obs.png"),
])
def test_an_upload_is_written_inside_the_uploads_directory_whatever_it_is_named(app, tmp_path, request_id,
                                                                                  filename):
    """sglang saved a multipart upload of `POST /v1/actions/generations` to
    os.path.join(uploads, f"{request_id}_{filename}"), both the caller's, making the directories on the way:
    a token holder wrote what bytes they liked wherever the server's user may write (~/.ssh/authorized_keys,
    a sitecustomize.py: their code run as that user). Both names are now reduced to plain names."""
    from starlette.testclient import TestClient

    asgi, auth = app
    outside = tmp_path / "outside"
    outside.mkdir()
    rid, name = request_id.format(outside=outside), filename.format(outside=outside)
    client = TestClient(asgi, raise_server_exceptions=False)  # no scheduler behind it: what runs before counts
    client.post("/v1/actions/generations", headers=auth,
                data={"request_id": rid, "prompt": "pick", "domain_id": "0", "raw_action_dim": "7"},
                files={"image_reference": (name, b"attacker's bytes", "image/png")})
    planted = [p for p in outside.rglob("*") if p.is_file()]
    assert planted == []  # before: outside/planted_obs.png (or planted.png) holding the caller's bytes


def test_a_plainly_named_upload_still_reaches_the_scheduler(app, monkeypatch):
    from sglang.multimodal_gen.runtime.entrypoints.action import protocol as action_protocol
    from starlette.testclient import TestClient

    asgi, auth = app
    seen = {}

    async def forward(req, *args, **kwargs):  # the scheduler: what the upload became
        sp = getattr(req, "sampling_params", req)
        path = getattr(req, "image_path", None) or getattr(sp, "image_path", None)
        with open(path, "rb") as f:
            seen[path] = f.read()
        raise ValueError("seen")  # sglang answers a ValueError with HTTP 400

    monkeypatch.setattr(action_protocol.async_scheduler_client, "forward", forward)
    reply = TestClient(asgi).post("/v1/actions/generations", headers=auth,
                                  data={"request_id": "episode-3/step 17", "prompt": "pick", "domain_id": "0",
                                        "raw_action_dim": "7"},
                                  files={"image_reference": ("cam 0.png", b"png bytes", "image/png")})
    assert reply.status_code == 400 and reply.json()["detail"] == "seen"
    [(path, data)] = seen.items()
    assert data == b"png bytes" and path.endswith("episode-3_step_17_cam_0.png")


def test_a_path_on_the_server_is_not_taken_for_an_image(app, forwarded, tmp_path):
    """A JSON (or websocket) observation whose image is a string path travelled to the bridge as is, and
    the bridge reads local paths (sglang's offline clients send them): any caller could have the server
    open its files, and tell from the answer which exist, which it may read and which are images (an
    image it runs on). Only the uploads this request made are paths the server reads."""
    from starlette.testclient import TestClient

    asgi, auth = app
    private = tmp_path / "private.png"
    private.write_bytes(b"not for callers")
    client = TestClient(asgi)
    for image in (str(private), [str(private)], "../../etc/passwd"):
        body = {"input": {"task": "pick", "observation": {"image": image}},
                "parameters": {"domain_id": 0, "raw_action_dim": 7}}
        reply = client.post("/v1/actions/generations", headers=auth, json=body)
        assert reply.status_code == 400 and "path" in reply.json()["detail"], (image, reply.text)
    assert forwarded == []  # before: each went to the bridge, which opened it


def test_an_image_over_the_bridges_pixel_limit_is_refused_before_it_is_decoded(app, forwarded):
    """sglang decodes a b64_json image in the HTTP server itself (PIL, then convert("RGB")), up to PIL's own
    bomb limit of ~179 M pixels: ~1 GB for one request whose body, a PNG of one colour, is about a MB. A few
    at once from any token holder and the server is out of memory; the bridge refuses every image over
    its limit (`compat.unpickle.MAX_IMAGE_PIXELS`) anyway, after all that. Refused now on its header."""
    import base64
    import io

    from PIL import Image
    from starlette.testclient import TestClient

    from candidate_scheduler.compat.unpickle import MAX_IMAGE_PIXELS

    asgi, auth = app
    client = TestClient(asgi)

    def ask(width: int, height: int):
        png = io.BytesIO()
        Image.new("L", (width, height)).save(png, format="PNG")
        image = {"b64_json": base64.b64encode(png.getvalue()).decode()}
        body = {"input": {"task": "pick", "observation": {"image": image}},
                "parameters": {"domain_id": 0, "raw_action_dim": 7}}
        return client.post("/v1/actions/generations", headers=auth, json=body)

    over = ask(MAX_IMAGE_PIXELS // 1000 + 1, 1000)
    assert over.status_code == 400 and "pixels" in over.json()["detail"], over.text
    assert forwarded == []  # before: decoded (3 bytes a pixel, twice) and sent to the bridge to be refused
    assert ask(64, 48).json()["detail"] == "forwarded"  # an image of a camera's size goes on


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_refused_unread(app, forwarded, monkeypatch, chunked):
    """sglang reads a request's whole body into memory (`request.json()`) however long it is: any token
    holder could send gigabytes and take the server down for everyone. A body over `MAX_BODY_BYTES` (far
    over any request the bridge can take) is refused: on its Content-Length, or once read past it."""
    from starlette.testclient import TestClient

    from candidate_scheduler.compat import http as compat_http

    asgi, auth = app
    monkeypatch.setattr(compat_http, "MAX_BODY_BYTES", 64 * 1024, raising=False)  # small, for the test
    body = (b'{"input": {"task": "pick", "observation": {"image": [[[1, 2, 3]]]}}, '
            b'"parameters": {"domain_id": 0, "raw_action_dim": 7}, "padding": "' + b"x" * (128 * 1024) + b'"}')
    content = iter([body[:1000], body[1000:]]) if chunked else body  # an iterator: sent chunked, no length
    reply = TestClient(asgi).post("/v1/actions/generations", headers={**auth, "Content-Type": "application/json"},
                                  content=content)
    assert (reply.status_code, forwarded) == (413, [])  # before: read whole, parsed and sent on
