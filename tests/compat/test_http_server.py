"""sglang's own FastAPI server (started by `compat.http.run_http_server`) with the compat bridge as its
scheduler: POST /v1/actions/generations returns the action, and the N candidates when asked; requests
naming the embodiment (domain_name) resolve as sglang resolves them; the metadata says what is true."""

from __future__ import annotations

import base64
import io
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.core import reducers, rng
from candidate_scheduler.core.request import MAX_OBSERVATIONS_PER_GROUP

from .conftest import ENV, ROOT

pytestmark = pytest.mark.sglang

SAMPLING = {"height": 64, "width": 64, "steps": 2, "horizon": 4, "guidance_scale": 1.0, "action_mode": "policy",
            "domain_id": 0, "raw_action_dim": 7, "fps": 5}


HEADER_TIMEOUT_S = 3.0  # the server's (compat/header_timeout.py): short, for the test of it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: dict, timeout: float = 120.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:  # sglang answers an unhandled server error with plain text
            return e.code, {"text": body.decode(errors="replace")}


@pytest.fixture(scope="module")
def http_server(compat, tmp_path_factory):
    """`candidate-scheduler http` in a subprocess: sglang's server with --warmup-mode server, so its
    start-up warmup requests go through the bridge too."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("http") / "http.log"
    code = ("from candidate_scheduler.compat.http import run_http_server; "
            f"run_http_server({compat.port}, {str(compat.model_dir)!r}, '127.0.0.1', {port}, warmup_mode='server', "
            f"input_save_path={str(log_path.parent / 'uploads')!r}, log_level='warning', "
            f"header_timeout_s={HEADER_TIMEOUT_S})")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:  # another process's start-up: poll its readiness endpoint
            if proc.poll() is not None:
                raise RuntimeError(f"http server exited ({proc.returncode}): {log_path.read_text()[-3000:]}")
            try:
                if _get(f"{base}/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"http server not healthy; log {log_path}")
            time.sleep(0.25)
        yield base, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _png_b64(image: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _body(image, prompt: str, seed: int, request_id: str, **parameters) -> dict:
    return {
        "request_id": request_id,
        "input": {"task": prompt, "observation": {"image": {"b64_json": _png_b64(image)}}},
        "parameters": {"height": 64, "width": 64, "num_inference_steps": 2, "action_horizon": 4, "domain_id": 0,
                       "raw_action_dim": 7, "guidance_scale": 1.0, "fps": 5, "seed": seed, **parameters},
    }


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def base_url(http_server):
    return http_server[0]


def test_health_after_server_warmup_and_metadata(http_server):
    base, log_path = http_server
    assert _get(f"{base}/health")[0] == 200
    # --warmup-mode server sent its warmup requests through the bridge, and they succeeded
    assert "warmup failed" not in log_path.read_text().lower()
    status, body = _get(f"{base}/v1/actions/metadata")
    assert status == 200 and json.loads(body)["policy_family"] == "cosmos3"


def test_a_request_head_never_finished_is_closed_at_the_header_timeout(base_url):
    """Through sglang's own launcher: a connection that never ends its head does not hold the server."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as conn:
        t0 = time.monotonic()
        conn.sendall(b"POST /v1/actions/generations HTTP/1.1\r\nHost: x\r\n")
        conn.settimeout(HEADER_TIMEOUT_S + 10)
        while conn.recv(4096):
            pass
        assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - t0 < HEADER_TIMEOUT_S + 10
    assert _get(f"{base_url}/health")[0] == 200  # and it goes on serving


def test_count_one_action(base_url, compat):
    image = _image(31)
    status, resp = _post(f"{base_url}/v1/actions/generations", _body(image, "pick", 5, "http-1"))
    assert status == 200, resp
    assert resp["id"] == "http-1" and resp["object"] == "action.generation"
    [entry] = resp["data"]
    assert entry["candidate_index"] == 0 and entry["action"]["shape"] == [4, 7]
    np.testing.assert_array_equal(np.asarray(entry["action"]["values"], np.float32),
                                  compat.reference(image, "pick", SAMPLING, 5))
    assert "candidate_group" not in resp


def test_candidates_listed_with_candidate_index(base_url, compat):
    image = _image(32)
    spec = {"count": 3, "reducer": "mean", "return_candidates": True}
    status, resp = _post(f"{base_url}/v1/actions/generations", _body(image, "place", 9, "http-n", candidates=spec))
    assert status == 200, resp
    seeds = rng.candidate_seeds(9, 3, "per_candidate")
    refs = np.stack([compat.reference(image, "place", SAMPLING, s) for s in seeds])
    assert [d["candidate_index"] for d in resp["data"]] == [0, 1, 2]
    assert [d["input_index"] for d in resp["data"]] == [0, 0, 0]
    for d, ref in zip(resp["data"], refs):
        np.testing.assert_array_equal(np.asarray(d["action"]["values"], np.float32), ref)
    np.testing.assert_array_equal(np.asarray(resp["reduced_action"]["values"], np.float32), reducers.reduce("mean", refs))
    assert resp["candidate_group"]["candidate_seeds"] == list(seeds)
    assert resp["candidate_group"]["count"] == 3 and resp["usage"]["num_candidates"] == 3
    assert resp["served_count"] == resp["candidate_group"]["served_count"] == 3


def test_candidates_reduced_only(base_url, compat):
    image = _image(33)
    status, resp = _post(f"{base_url}/v1/actions/generations",
                         _body(image, "place", 9, "http-r", candidates={"count": 3, "reducer": "median"}))
    assert status == 200, resp
    refs = np.stack([compat.reference(image, "place", SAMPLING, s) for s in rng.candidate_seeds(9, 3, "per_candidate")])
    [entry] = resp["data"]
    np.testing.assert_array_equal(np.asarray(entry["action"]["values"], np.float32), reducers.reduce("median", refs))
    assert resp["candidate_group"]["reducer"] == "median" and "reduced_action" not in resp


def test_bad_candidate_spec_is_a_400(base_url):
    status, resp = _post(f"{base_url}/v1/actions/generations",
                         _body(_image(34), "x", 1, "http-bad", candidates={"count": 2, "typo": 1}))
    assert status == 400 and "candidate spec" in json.dumps(resp)


# ---- what the metadata declares is what the server does ----------------------------------------------


def test_metadata_declares_candidates_and_batched_inputs(base_url):
    status, body = _get(f"{base_url}/v1/actions/metadata")
    assert status == 200
    meta = json.loads(body)
    caps = meta["capabilities"]
    assert meta["scheduler"] == "candidate_scheduler" and meta["policy_family"] == "cosmos3"
    assert caps["multiple_candidates"] is True
    assert caps["max_candidates"] == protocol.MAX_CANDIDATES == 256
    assert caps["candidate_reducers"] == ["none", "mean", "median", "medoid"]
    assert caps["candidate_seed_policies"] == ["per_candidate", "offset", "explicit"]
    assert caps["batch_inputs"] is True and caps["max_batch_size"] == MAX_OBSERVATIONS_PER_GROUP == 64
    assert caps["action_modes"] == ["policy"] and caps["batched_action_modes"] == ["policy"]
    assert meta["input"]["modalities"] == ["image"] and "droid_lerobot" in meta["input"]["domain_names"]


def test_realtime_websocket_sends_the_same_metadata(base_url):
    import msgpack
    from websockets.sync.client import connect

    with connect(base_url.replace("http://", "ws://") + "/v1/actions/realtime", open_timeout=10) as ws:
        first = msgpack.unpackb(ws.recv(timeout=10))
    assert first["capabilities"] == json.loads(_get(f"{base_url}/v1/actions/metadata")[1])["capabilities"]
    assert first["capabilities"]["multiple_candidates"] is True


def test_batched_observations_up_to_the_declared_maximum(base_url, compat):
    images = [_image(40), _image(41)]
    body = _body(images[0], "pick", 6, "http-b")
    body["input"]["observation"]["image"] = [{"b64_json": _png_b64(i)} for i in images]
    status, resp = _post(f"{base_url}/v1/actions/generations", body)
    assert status == 200, resp
    assert [d["input_index"] for d in resp["data"]] == [0, 1]
    # one observation of a batch gets the action it gets alone (same seed)
    np.testing.assert_array_equal(np.asarray(resp["data"][1]["action"]["values"], np.float32),
                                  compat.reference(images[1], "pick", SAMPLING, 6))


# ---- domain_name, as sglang users write it -----------------------------------------------------------


def _named_body(image, seed, request_id, **embodiment) -> dict:
    body = _body(image, "pick", seed, request_id)
    for key in ("domain_id", "raw_action_dim"):
        del body["parameters"][key]
    body["parameters"].update(embodiment)
    return body


def test_domain_name_with_a_width_the_checkpoint_has(base_url, compat):
    """droid_lerobot is domain 8; the tiny checkpoint's stats cover 7 dims, so the width is given."""
    image = _image(35)
    status, resp = _post(f"{base_url}/v1/actions/generations",
                         _named_body(image, 7, "http-dn", domain_name="droid_lerobot", raw_action_dim=7))
    assert status == 200, resp
    [entry] = resp["data"]
    np.testing.assert_array_equal(np.asarray(entry["action"]["values"], np.float32),
                                  compat.reference(image, "pick", {**SAMPLING, "domain_id": 8}, 7))
    # a different domain is a different conditioning: the name really selected domain 8
    assert not np.array_equal(np.asarray(entry["action"]["values"], np.float32),
                              compat.reference(image, "pick", SAMPLING, 7))


def test_domain_name_alone_takes_the_embodiments_width(http_server, compat):
    base, log_path = http_server
    status, resp = _post(f"{base}/v1/actions/generations",
                         _named_body(_image(36), 7, "http-dn10", domain_name="droid_lerobot"))
    if compat.backend == "fake" or _stats_dim(compat.model_dir) == 10:
        assert status == 200, resp
        assert resp["data"][0]["action"]["shape"] == [4, 10]
    else:
        # resolved to 10 dims, which this checkpoint's action stats do not cover: the worker refuses the
        # group, and sglang's server turns a failed scheduler reply into a bare HTTP 500 (it logs why)
        assert status == 500, resp
        wait_for_log = time.monotonic() + 10
        while "raw_action_dim is 10" not in log_path.read_text() and time.monotonic() < wait_for_log:
            time.sleep(0.1)
        assert "raw_action_dim is 10" in log_path.read_text()


@pytest.mark.parametrize("embodiment, message", [
    ({"domain_name": "r2d2"}, "Unknown action domain name 'r2d2'. Valid names: ["),
    ({"domain_name": "libero"}, "No raw action dim for Cosmos3 embodiment 'libero'. Expected one of ["),
    ({"domain_id": 0}, "raw_action_dim is required when only domain_id is provided"),
    ({}, "Cosmos3 action requests require domain_name or domain_id"),
])
def test_embodiment_refusals_are_400s_in_sglangs_wording(base_url, embodiment, message):
    status, resp = _post(f"{base_url}/v1/actions/generations", _named_body(_image(37), 1, "http-dnx", **embodiment))
    assert status == 400 and message in resp.get("detail", ""), resp


def _stats_dim(model_dir) -> int | None:
    path = model_dir / "action_stats.json"
    if not path.exists():
        return None
    return len(json.loads(path.read_text())["global"]["q01"])
