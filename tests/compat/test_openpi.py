"""openpi's own client (`openpi-client` 0.1.2, numpy 1.x, in a venv of its own: a robot process)
against the openpi front, in front of a real scheduler and one Cosmos3 worker (this module's own),
or the fake native scheduler where a test must hold or fail a group.

Every reply is checked against what the native protocol answers for the same seed and spec, bit for
bit; the errors against the text openpi's client raises with.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import msgpack
import msgspec
import numpy as np
import pytest
import websockets.sync.client

from candidate_scheduler import protocol
from candidate_scheduler.service.client import Client, make_request, synthetic_image
from candidate_scheduler.service.openpi import launch, msgpack_numpy
from candidate_scheduler.service.processes import ChildProcess
from tests.conftest import Services

from . import openpi_client_env
from .conftest import ENV, FAIL_PROMPT, HOLD_PROMPT, ROOT, FakeScheduler

pytestmark = pytest.mark.sglang

ROBOT = Path(__file__).with_name("openpi_robot.py")
READY = re.compile(r"openpi front: listening on (ws://\S+)")
IMAGES = {"a": synthetic_image(64, 64, seed=21), "b": synthetic_image(72, 96, seed=22)}
FAST = {"steps": 2, "horizon": 4}  # sampling of most calls: the tiny model, a couple of forwards


class Front(ChildProcess):
    def __init__(self, request: str, control: str | None, *extra: str, log_path: Path):
        cmd = [sys.executable, "-m", "candidate_scheduler.service.openpi", "--scheduler-request", request,
               "--port", "0", "--log-level", "INFO", *(["--scheduler-control", control] if control else []), *extra]
        super().__init__(cmd, log_path, env=ENV, cwd=ROOT)
        self.url = self.wait_line(READY, 30).group(1)


def arr(name: str) -> dict:
    return {"$array": name}


@pytest.fixture(scope="module")
def client_python() -> Path:
    return openpi_client_env.client_python()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory, model_dir):
    """A scheduler and one Cosmos3 worker of capacity 8 for this module (no sglang in this process)."""
    services = Services(tmp_path_factory.mktemp("openpi-service"))
    try:
        handle = services.scheduler()
        services.worker(handle, "cosmos3", 8)
        handle.wait_workers(1, timeout_s=180)
        yield handle
    finally:
        services.close()


@pytest.fixture(scope="module")
def front(scheduler, tmp_path_factory):
    f = Front(scheduler.request, scheduler.control, log_path=tmp_path_factory.mktemp("openpi") / "front.log")
    yield f
    f.stop()


@pytest.fixture
def robots(client_python, tmp_path):
    """run(url, [[step, ...] per robot], arrays) -> [[result, ...] per robot]; reply arrays resolved."""

    def run(url: str, scripts: list[list[dict]], arrays: dict[str, np.ndarray] | None = None, timeout_s: float = 120):
        job, data = tmp_path / "job.json", tmp_path / "input.npz"
        job.write_text(json.dumps({"url": url, "robots": scripts}))
        np.savez(data, **{**IMAGES, **(arrays or {})})
        proc = subprocess.run([str(client_python), str(ROBOT), str(job), str(data), str(tmp_path)],
                              capture_output=True, text=True, timeout=timeout_s)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = json.loads((tmp_path / "result.json").read_text())
        with np.load(tmp_path / "arrays.npz") as stored:
            out = {k: stored[k] for k in stored.files}
        for steps in results:
            for step in steps:
                for key, value in (step["reply"] or {}).items():
                    if isinstance(value, dict) and "$array" in value:
                        step["reply"][key] = out[value["$array"]]
        return results

    return run


def infer(obs: dict) -> dict:
    return {"op": "infer", "obs": obs}


def ok(step: dict) -> dict:
    assert step["ok"], f"{step['error_type']}: {step['error']}\n{step.get('traceback', '')}"
    return step["reply"]


def refused(step: dict, *needles: str) -> str:
    assert not step["ok"], f"expected an error, got a reply with {sorted(step['reply'])}"
    assert step["error_type"] == "RuntimeError", step  # what WebsocketClientPolicy.infer raises for a text frame
    assert step["error"].startswith("Error in inference server:\ncandidate_scheduler openpi: "), step["error"]
    for needle in needles:
        assert needle in step["error"], step["error"]
    return step["error"]


# ---- replies ---------------------------------------------------------------------------------------


def test_reply_is_the_native_reply_bit_for_bit(scheduler, front, robots):
    obs = {"observation/image": arr("a"), "observation/wrist_image": arr("b"), "observation/state": arr("state"),
           "prompt": "put the cup in the sink", "seed": {"$int64": 7},  # a numpy scalar, as robots send seeds
           "candidates": {"count": 4, "reducer": "medoid", "return_candidates": True}, "sampling": FAST}
    chw = {"observation/image": {"$array": "a_chw"}, "prompt": "put the cup in the sink", "seed": 7,
           "candidates": {"count": 4, "reducer": "medoid"}, "sampling": FAST}
    unit = {**chw, "observation/image": arr("a_float")}
    [[rich, from_chw, from_float, unseeded]] = robots(front.url, [[
        infer(obs), infer(chw), infer(unit), infer({"image": arr("a"), "prompt": "put the cup in the sink", "sampling": FAST})]],
        {"state": np.zeros(8, np.float64), "a_chw": IMAGES["a"].transpose(2, 0, 1),
         "a_float": IMAGES["a"].astype(np.float32) / 255.0})
    with Client(scheduler.request) as c:
        native = c.submit(IMAGES["a"], "put the cup in the sink", count=4, reducer="medoid", return_candidates=True,
                          seed=7, timeout_s=60, **FAST)
        reply = ok(unseeded)
        again = c.submit(IMAGES["a"], "put the cup in the sink", seed=reply["seed"], timeout_s=60, **FAST)
    assert native.ok, native.error
    got = ok(rich)
    assert got["actions"].dtype == np.float32 and got["actions"].shape == (4, 7)
    assert got["actions"].tobytes() == native.action.tobytes()
    assert got["candidates"].tobytes() == native.candidates.tobytes()
    assert got["candidate_seeds"] == native.candidate_seeds and got["seed"] == 7
    assert got["chosen_candidate"] == native.chosen_candidate
    assert got["served_count"] == 4 and got["reducer"] == "medoid"
    assert got["ignored_keys"] == ["observation/state", "observation/wrist_image"]
    assert got["server_timing"]["infer_ms"] > 0 and got["server_timing"]["scheduler_denoise_ms"] > 0
    assert got["scheduler_metrics"]["admission_mode"] == "atomic"
    # CHW uint8 and float [0, 1] are the same observation
    for other in (ok(from_chw), ok(from_float)):
        assert other["actions"].tobytes() == native.action.tobytes()
        assert "candidates" not in other  # not asked for
    # no seed: a fresh one, reported, and it reproduces natively (count 1 through the service is
    # sglang's own output: tests/integration/test_scheduler_cosmos3.py)
    assert reply["candidate_seeds"] == [reply["seed"]] and reply["served_count"] == 1
    assert reply["actions"].tobytes() == again.action.tobytes()


def c_request(obs: dict) -> protocol.SubmitRequest:
    return make_request(IMAGES[obs["observation/image"]["$array"]], obs["prompt"], seed=obs["seed"],
                        count=obs["candidates"]["count"], **obs["sampling"])


def test_eight_robots_at_once_each_get_their_own_answer(scheduler, front, robots):
    def obs(robot: int, call: int) -> dict:
        return {"observation/image": arr("ab"[robot % 2]), "prompt": f"task {robot % 3}", "seed": 1000 * robot + call,
                "candidates": {"count": 2}, "sampling": FAST}

    results = robots(front.url, [[infer(obs(r, k)) for k in range(3)] for r in range(8)])
    with Client(scheduler.request) as c:
        sent = {(r, k): c.send(c_request(obs(r, k))) for r in range(8) for k in range(3)}
        native = {key: c.wait(rid, 60) for key, rid in sent.items()}
    actions = set()
    co_batched = 0
    for r in range(8):
        for k in range(3):
            got = ok(results[r][k])
            assert got["seed"] == 1000 * r + k
            assert got["actions"].tobytes() == native[r, k].action.tobytes(), (r, k)
            assert got["candidate_seeds"] == native[r, k].candidate_seeds
            actions.add(got["actions"].tobytes())
            co_batched += got["scheduler_metrics"]["co_batched_batches"]
    assert len(actions) == 24  # every seed its own action: no answer went to the wrong robot
    assert co_batched > 0, "eight robots at once were never co-batched"


def test_metadata_and_server_wide_defaults(scheduler, front, robots, tmp_path):
    custom = Front(scheduler.request, scheduler.control, "--count", "3", "--reducer", "median",
                   "--steps", "2", "--horizon", "4", "--seed", "99", "--prompt", "stack the blocks",
                   "--image-key", "observation.images.top", log_path=tmp_path / "custom.log")
    try:
        [[plain_meta], [meta, call, wrong_key]] = robots(front.url, [[{"op": "metadata"}]]) + robots(custom.url, [[
            {"op": "metadata"}, infer({"observation.images.top": arr("b"), "observation.images.wrist": arr("a")}),
            infer({"observation/image": arr("a")})]])
    finally:
        custom.stop()
    native_sampling = {k: v for k, v in msgspec.structs.asdict(protocol.SamplingMsg()).items()
                       if k not in ("rollout", "noise_level", "return_step_indices")}
    plain = ok(plain_meta)
    assert plain["model"] == "cosmos3"
    assert (plain["action_horizon"], plain["action_dim"]) == (16, 7)  # Cosmos3's default embodiment, resolved
    assert plain["defaults"]["sampling"] == native_sampling
    assert plain["defaults"]["candidates"] == msgspec.structs.asdict(protocol.CandidateSpecMsg())
    assert plain["defaults"]["candidates"]["count"] == 1 and plain["defaults"]["candidates"]["reducer"] == "mean"
    assert plain["defaults"]["seed"] is None
    assert plain["candidates"]["max_count"] == protocol.MAX_CANDIDATES
    assert {"mean", "median", "medoid", "none"} <= set(plain["candidates"]["reducers"])
    assert plain["observation"]["image_keys"][:2] == ["observation/image", "image"]
    assert {"observation/wrist_image", "observation/state"} <= set(plain["observation"]["ignored_keys"])
    assert plain["scheduler"]["reachable"] and plain["scheduler"]["workers"] >= 1
    m = ok(meta)
    assert m["defaults"]["candidates"]["count"] == 3 and m["defaults"]["candidates"]["reducer"] == "median"
    assert m["action_horizon"] == 4 and m["defaults"]["seed"] == 99
    assert m["observation"]["image_keys"] == ["observation.images.top"]
    got = ok(call)
    with Client(scheduler.request) as c:
        native = c.submit(IMAGES["b"], "stack the blocks", count=3, reducer="median", seed=99, timeout_s=60, **FAST)
    assert got["actions"].tobytes() == native.action.tobytes() and got["served_count"] == 3
    assert got["ignored_keys"] == ["observation.images.wrist"]
    refused(wrong_key, "'observation.images.top'", "--openpi-image-key")


# ---- errors: a text frame, and the connection and the server keep serving --------------------------


def _frame(obj) -> str:
    return msgpack.packb(obj).hex()


def test_bad_frames_get_a_clear_error_and_the_connection_keeps_serving(front, robots):
    good = {"observation/image": arr("a"), "prompt": "go", "seed": 3, "sampling": FAST}
    bad_dtype = _frame({"observation/image": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}})
    short = _frame({"observation/image": {b"__ndarray__": True, b"data": b"\0" * 5, b"dtype": "|u1", b"shape": [2, 3]}})
    ext = msgpack.packb({"observation/image": msgpack.ExtType(42, b"x")}).hex()
    steps = [
        infer({"prompt": "no image here"}),
        {"op": "raw", "fill": "c1", "size": 16},
        {"op": "text", "text": "hello"},
        {"op": "raw", "fill": _frame([1, 2, 3]), "size": 1},
        {"op": "raw", "fill": bad_dtype, "size": 1},
        {"op": "raw", "fill": short, "size": 1},
        {"op": "raw", "fill": ext, "size": 1},
        {"op": "raw", "fill": "91" * 5000, "size": 1},  # 5000 nested arrays, never closed
        infer({**good, "prompt": 5}),
        infer({**good, "candidates": {"count": "many"}}),
        infer({**good, "candidates": {"cuont": 2}}),
        infer({**good, "sampling": {"steps": 2.5}}),
        infer({**good, "sampling": {"rollout": True}}),
        infer({**good, "seed": -1}),
        infer({**good, "observation/image": arr("ints")}),
        infer({**good, "observation/image": arr("float255")}),
        infer({**good, "observation/image": arr("gray")}),
        infer({**good, "candidates": {"reducer": "bogus"}}),
        infer({**good, "candidates": {"count": protocol.MAX_CANDIDATES + 1}}),
        infer(good),
    ]
    [results] = robots(front.url, [steps], {
        "ints": IMAGES["a"].astype(np.int64), "float255": IMAGES["a"].astype(np.float32),
        "gray": IMAGES["a"][:, :, 0]})
    results = iter(results)
    refused(next(results), "no image", "'observation/image'")
    refused(next(results), "not valid msgpack")
    refused(next(results), "binary")
    refused(next(results), "an observation is a map", "list")
    refused(next(results), "dtype '|O' is not accepted")
    refused(next(results), "5 bytes", "needs 6")
    refused(next(results), "extension type 42")
    refused(next(results), "msgpack")
    refused(next(results), "prompt must be a string")
    refused(next(results), "candidates.count", "int")
    refused(next(results), "candidates.cuont is not a field")
    refused(next(results), "sampling.steps")
    refused(next(results), "rollouts are not served")
    refused(next(results), "seed must be in [0, 2**64)")
    refused(next(results), "int64", "uint8")
    refused(next(results), "[0, 255]", "send the image as uint8")
    refused(next(results), "[H, W, 3]")
    refused(next(results), "invalid", "unknown_reducer")
    refused(next(results), "count_over_limit")
    assert ok(next(results))["actions"].shape == (4, 7)  # the same connection, after every error above


def test_oversized_frames(scheduler, robots, tmp_path):
    small = Front(scheduler.request, scheduler.control, "--max-frame-bytes", "65536",
                  log_path=tmp_path / "small.log")
    try:
        good = infer({"observation/image": arr("a"), "seed": 1, "sampling": FAST})
        [[over, still, way_over, reconnect, fresh]] = robots(small.url, [[
            {"op": "raw", "fill": "00", "size": 100_000}, good,
            {"op": "raw", "fill": "00", "size": 200_000}, {"op": "reconnect"}, good]])
        assert small.alive()
    finally:
        small.stop()
    refused(over, "100000 bytes", "65536-byte limit")
    ok(still)  # read and refused: the connection stays
    # past twice the limit the websocket library closes with 1009 rather than buffer it (RFC 6455)
    assert not way_over["ok"] and "1009" in way_over["error"], way_over
    ok(reconnect)
    ok(fresh)


# ---- with the fake scheduler: held and failed groups ------------------------------------------------


def _send(url: str, obs: dict):
    ws = websockets.sync.client.connect(url, compression=None, max_size=None)
    msgpack_numpy.unpackb(ws.recv())  # metadata
    ws.send(msgpack_numpy.packb(obs))
    return ws


def test_disconnect_cancels_the_group_and_timeouts_answer(fake_scheduler, tmp_path):
    fake = fake_scheduler
    waiting = Front(fake.request_endpoint, fake.control_endpoint, log_path=tmp_path / "front.log")
    timed = Front(fake.request_endpoint, fake.control_endpoint, "--request-timeout", "0.5", log_path=tmp_path / "timed.log")
    try:
        obs = {"observation/image": IMAGES["a"], "prompt": HOLD_PROMPT}
        mark = fake.mark()
        ws = _send(waiting.url, obs)
        fake.wait(lambda: len(fake.received) > mark, what="the held group")
        rid = fake.since(mark)[0].request_id
        ws.close()  # the robot goes away mid-call
        fake.wait(lambda: rid in fake.cancels, what="the cancel of the abandoned group")

        ws = _send(timed.url, obs)
        answer = ws.recv(timeout=30)
        assert isinstance(answer, str) and "no result within 0.5 s" in answer, answer
        rid = fake.since(mark)[-1].request_id
        assert rid in answer
        fake.wait(lambda: rid in fake.cancels, what="the cancel of the timed-out group")
        ws.send(msgpack_numpy.packb({**obs, "prompt": FAIL_PROMPT}))
        failed = ws.recv(timeout=30)
        assert isinstance(failed, str) and "the scheduler answered failed: worker_failed" in failed, failed
        ws.send(msgpack_numpy.packb({"observation/image": IMAGES["b"], "prompt": "fine", "seed": 5}))
        reply = msgpack_numpy.unpackb(ws.recv(timeout=30))
        assert reply["actions"].shape == (16, 7) and reply["candidate_seeds"] == [5]
        ws.close()
        with urllib.request.urlopen(timed.url.replace("ws://", "http://") + "/healthz", timeout=10) as r:
            assert r.status == 200 and r.read() == b"OK\n"
    finally:
        fake.release()
        waiting.stop()
        timed.stop()


def test_a_scheduler_that_goes_away_is_said_so_not_an_internal_error(tmp_path):
    """The front serve starts does not resubmit (--no-resubmit): when its scheduler stops answering, the
    robot is told the scheduler is not available (it was told "internal error", and counted so)."""
    fake = FakeScheduler()
    front = Front(fake.request_endpoint, fake.control_endpoint, "--no-resubmit", log_path=tmp_path / "front.log")
    try:
        mark = fake.mark()
        ws = _send(front.url, {"observation/image": IMAGES["a"], "prompt": HOLD_PROMPT})
        fake.wait(lambda: len(fake.received) > mark, what="the held group")
        fake.close()  # the scheduler goes away with the group in flight
        answer = ws.recv(timeout=30)  # within 2 x the client's liveness (3 s)
        assert isinstance(answer, str) and "the scheduler is not available" in answer, answer
        ws.close()
    finally:
        front.stop()


def test_spawn_from_serve_flags(fake_scheduler):
    """What `serve --openpi-port` calls: the flags travel and the url comes back."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    launch.add_openpi_arguments(parser)
    args = parser.parse_args(["--openpi-port", "0", "--openpi-count", "5", "--openpi-float-range=-1,1",
                              "--openpi-return-candidates", "--openpi-steps", "2"])
    bound = {"request": fake_scheduler.request_endpoint, "control": fake_scheduler.control_endpoint}
    proc, url = launch.spawn_openpi_front(args, bound)
    try:
        assert re.fullmatch(r"ws://127\.0\.0\.1:\d+", url)
        assert "--no-resubmit" in proc.args  # it stops with its scheduler: no next run to wait for
        ws = websockets.sync.client.connect(url, compression=None)
        meta = msgpack_numpy.unpackb(ws.recv())
        assert meta["defaults"]["candidates"]["count"] == 5 and meta["defaults"]["candidates"]["return_candidates"]
        assert meta["defaults"]["sampling"]["steps"] == 2
        assert "[-1,1]" in meta["observation"]["image_formats"][2]
        ws.send(msgpack_numpy.packb({"observation/image": IMAGES["a"].astype(np.float32) / 127.5 - 1.0, "seed": 4}))
        reply = msgpack_numpy.unpackb(ws.recv(timeout=30))
        assert reply["candidates"].shape == (5, 16, 7) and reply["served_count"] == 5
        sent = fake_scheduler.since(fake_scheduler.mark() - 1)[0]
        assert protocol.array_from_wire(sent.images).tobytes() == IMAGES["a"].tobytes()  # [-1, 1] back to uint8 exactly
        ws.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert launch.spawn_openpi_front(parser.parse_args([]), bound) == (None, None)
