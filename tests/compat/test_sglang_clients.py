"""sglang 0.5.23's own clients against the compat bridge: SchedulerClient, AsyncSchedulerClient and
DiffGenerator(local_mode=False). Every request below is built by sglang's own code (the action
endpoint's Cosmos3 builder + prepare_request, or DiffGenerator), so what reaches the bridge is exactly
what sglang sends to its own scheduler.

Run against the fake native scheduler by default, or the real service with CSC_COMPAT_BACKEND=service
(then `reference` is sglang's own pipeline and count=1 must match it bit for bit).
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from candidate_scheduler.core import reducers, rng

from .conftest import FAIL_PROMPT, HOLD_PROMPT

pytestmark = pytest.mark.sglang

SAMPLING = {"height": 64, "width": 64, "steps": 2, "horizon": 4, "guidance_scale": 1.0, "action_mode": "policy",
            "domain_id": 0, "raw_action_dim": 7, "fps": 5}


def observation(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


def action_req(sa, image, prompt: str, seed: int, request_id: str | None = None, **parameters):
    """A Req exactly as sglang's POST /v1/actions/generations builds it (infer_action)."""
    from sglang.multimodal_gen.configs.sample.cosmos3 import Cosmos3SamplingParams
    from sglang.multimodal_gen.runtime.entrypoints.action.cosmos3 import build_cosmos3_action_sampling_params
    from sglang.multimodal_gen.runtime.entrypoints.utils import prepare_request

    params = {"height": SAMPLING["height"], "width": SAMPLING["width"], "num_inference_steps": SAMPLING["steps"],
              "action_horizon": SAMPLING["horizon"], "guidance_scale": SAMPLING["guidance_scale"],
              "domain_id": SAMPLING["domain_id"], "raw_action_dim": SAMPLING["raw_action_dim"],
              "fps": SAMPLING["fps"], "seed": seed, **parameters}
    payload = {"request_id": request_id, "parameters": params}
    sp = build_cosmos3_action_sampling_params(payload, {"image": image, "prompt": prompt}, sa, Cosmos3SamplingParams)
    return prepare_request(sa, sp)


@pytest.fixture
def sync_client(compat):
    from sglang.multimodal_gen.runtime.scheduler_client import sync_scheduler_client

    def use(server_args):
        sync_scheduler_client.initialize(server_args)
        return sync_scheduler_client

    yield use
    sync_scheduler_client.close()


@contextlib.contextmanager
def raw_req_socket(endpoint: str, timeout_ms: int):
    """A bare REQ socket on the compat endpoint: for bytes sglang's own clients never send."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


def forward_async(server_args, *batches, timeout_ms=None):
    from sglang.multimodal_gen.runtime.scheduler_client import async_scheduler_client

    async def run():
        async_scheduler_client.initialize(server_args)
        try:
            return await asyncio.gather(*(async_scheduler_client.forward(b, timeout_ms=timeout_ms) for b in batches))
        finally:
            async_scheduler_client.close()

    return asyncio.run(run())


# ---- count = 1: what sglang's own scheduler would answer --------------------------------------------------


def test_sync_client_plain_req_is_count_one(compat, sync_client):
    sa = compat.server_args()
    image = observation(1)
    client = sync_client(sa)
    assert client.ping()
    out = client.forward(action_req(sa, image, "pick up the cube", 11, request_id="plain-1"))
    assert out.error is None, out.error
    expected = compat.reference(image, "pick up the cube", SAMPLING, 11)
    [entry] = out.output
    assert entry["request_id"] == "plain-1"
    assert entry["actions"].dtype == np.float32 and entry["actions"].shape == (4, 7)
    np.testing.assert_array_equal(entry["actions"], expected)
    assert (entry["action_mode"], entry["domain_id"], entry["raw_action_dim"]) == ("policy", 0, 7)
    assert entry["parameters"] == {"num_inference_steps": 2, "num_frames": 5}
    assert tuple(out.action_pred.shape) == (1, 4, 7)
    np.testing.assert_array_equal(out.action_pred[0].numpy(), expected)
    assert (out.action_mode, out.action_domain_id, out.action_raw_action_dim) == ("policy", 0, 7)


def test_async_client_concurrent_requests(compat):
    sa = compat.server_args()
    image = observation(2)
    seeds = [3, 4, 5, 6]
    reqs = [[action_req(sa, image, "push the block", s, request_id=f"async-{s}")] for s in seeds]  # [Req], like sglang
    outs = forward_async(sa, *reqs)
    for seed, out in zip(seeds, outs):
        assert out.error is None, out.error
        assert out.output[0]["request_id"] == f"async-{seed}"
        np.testing.assert_array_equal(out.output[0]["actions"], compat.reference(image, "push the block", SAMPLING, seed))


def test_generate_action_count_one(compat, tmp_path):
    from PIL import Image
    from sglang.multimodal_gen.runtime.entrypoints.diffusion_generator import DiffGenerator

    image = observation(3)
    path = tmp_path / "obs.png"
    Image.fromarray(image).save(path)
    gen = DiffGenerator.from_server_args(compat.server_args(), local_mode=False)  # pings the bridge
    try:
        out = gen.generate_action(dict(prompt="open the drawer", image_path=str(path), action_mode="policy",
                                       domain_id=0, raw_action_dim=7, num_frames=5, height=64, width=64,
                                       num_inference_steps=2, guidance_scale=1.0, fps=5, seed=21))
    finally:
        gen.shutdown()
    np.testing.assert_array_equal(out["actions"], compat.reference(image, "open the drawer", SAMPLING, 21))


# ---- candidate groups --------------------------------------------------------------------------------


def test_diffgenerator_num_outputs_is_one_offset_group(compat, tmp_path):
    """DiffGenerator expands num_outputs_per_prompt=K into K Reqs (seed base+i) sent as ONE list[Req];
    the bridge runs them as one group and answers one output per Req, each its own candidate."""
    from PIL import Image
    from sglang.multimodal_gen.runtime.entrypoints.diffusion_generator import DiffGenerator

    image = observation(4)
    path = tmp_path / "obs.png"
    Image.fromarray(image).save(path)
    mark = compat.fake.mark() if compat.fake else None
    gen = DiffGenerator.from_server_args(compat.server_args(), local_mode=False)
    try:
        results = gen.generate(dict(prompt="stack the cups", image_path=str(path), action_mode="policy", domain_id=0,
                                    raw_action_dim=7, num_frames=5, height=64, width=64, num_inference_steps=2,
                                    guidance_scale=1.0, fps=5, seed=100, num_outputs_per_prompt=3))
    finally:
        gen.shutdown()
    assert isinstance(results, list) and len(results) == 3
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.samples["actions"], compat.reference(image, "stack the cups", SAMPLING, 100 + i))
    if compat.fake:
        [sent] = compat.fake.since(mark)  # ONE native group, not three requests
        assert (sent.candidates.count, sent.candidates.seed_policy, sent.seed) == (3, "offset", 100)


def test_diffgenerator_candidate_spec_reduces(compat, tmp_path):
    """A candidate spec travels from DiffGenerator in sampling_params_kwargs["diffusers_kwargs"]["candidates"]
    (sglang copies diffusers_kwargs into Req.extra). One output: the reduced action; with
    return_candidates, the N candidates too."""
    from PIL import Image
    from sglang.multimodal_gen.runtime.entrypoints.diffusion_generator import DiffGenerator

    image = observation(5)
    path = tmp_path / "obs.png"
    Image.fromarray(image).save(path)
    gen = DiffGenerator.from_server_args(compat.server_args(), local_mode=False)
    kwargs = dict(prompt="wipe the table", image_path=str(path), action_mode="policy", domain_id=0, raw_action_dim=7,
                  num_frames=5, height=64, width=64, num_inference_steps=2, guidance_scale=1.0, fps=5, seed=7)
    try:
        reduced_only = gen.generate({**kwargs, "diffusers_kwargs": {"candidates": {"count": 4, "reducer": "mean"}}})
        with_cands = gen.generate({**kwargs, "diffusers_kwargs": {
            "candidates": {"count": 4, "reducer": "medoid", "return_candidates": True}}})
    finally:
        gen.shutdown()
    seeds = rng.candidate_seeds(7, 4, "per_candidate")
    assert seeds[0] == 7  # candidate 0 is the count=1 answer
    refs = np.stack([compat.reference(image, "wipe the table", SAMPLING, s) for s in seeds])

    out = reduced_only.samples
    np.testing.assert_array_equal(out["actions"], reducers.reduce("mean", refs))
    assert out["candidate_group"]["candidate_seeds"] == list(seeds)
    assert tuple(reduced_only.action.shape) == (1, 4, 7)

    out = with_cands.samples
    np.testing.assert_array_equal(out["actions"], refs)  # rows are candidates 0..N-1
    medoid = reducers.reduce_full("medoid", refs)
    np.testing.assert_array_equal(out["reduced_actions"], medoid.action)
    assert out["candidate_group"]["chosen_candidate"] == medoid.chosen_candidate
    assert tuple(with_cands.action.shape) == (4, 4, 7)


def test_sync_client_candidate_spec_in_req_extra(compat, sync_client):
    sa = compat.server_args()
    image = observation(6)
    req = action_req(sa, image, "grasp", 40, request_id="cand-extra")
    req.extra["candidates"] = {"count": 3, "reducer": "median", "seed_policy": "offset"}
    out = sync_client(sa).forward(req)
    assert out.error is None, out.error
    refs = np.stack([compat.reference(image, "grasp", SAMPLING, 40 + i) for i in range(3)])
    np.testing.assert_array_equal(out.output[0]["actions"], reducers.reduce("median", refs))
    assert out.output[0]["request_id"] == "cand-extra"


def test_batched_observations_with_candidates(compat, sync_client):
    """A batched policy request (image list, one prompt per image) with candidates: one group, actions
    per observation; with return_candidates the rows are candidate-major [N*B, H, D]."""
    sa = compat.server_args(batching_max_size=4)
    images = [observation(20), observation(21)]
    req = action_req(sa, images, "sort", 50, request_id="batched")
    req.extra["candidates"] = {"count": 2, "reducer": "mean", "return_candidates": True}
    out = sync_client(sa).forward(req)
    assert out.error is None, out.error
    seeds = rng.candidate_seeds(50, 2, "per_candidate")
    refs = np.stack([np.stack([compat.reference(im, "sort", SAMPLING, s) for im in images]) for s in seeds])  # [N,B,H,D]
    entry = out.output[0]
    np.testing.assert_array_equal(entry["actions"], refs.reshape(4, 4, 7))
    np.testing.assert_array_equal(entry["reduced_actions"], reducers.reduce("mean", refs))
    assert entry["candidate_group"]["num_inputs"] == 2
    plain = sync_client(sa).forward(action_req(sa, images, "sort", 50))
    np.testing.assert_array_equal(plain.output[0]["actions"], refs[0])  # count=1: [B, H, D], candidate 0
    assert tuple(plain.action_pred.shape) == (2, 4, 7)


# ---- protocol behaviour (fake backend) -------------------------------------------------------------------


def test_ping_is_answered_while_a_request_is_in_flight(fake_compat, sync_client):
    """sglang's scheduler queues a ping behind work; the bridge answers it from its receive loop."""
    from sglang.multimodal_gen.runtime.scheduler_client import async_scheduler_client

    fake = fake_compat.fake
    sa = fake_compat.server_args()
    mark = fake.mark()

    async def run():
        async_scheduler_client.initialize(sa)
        try:
            held = asyncio.create_task(async_scheduler_client.forward(action_req(sa, observation(7), HOLD_PROMPT, 1)))
            await asyncio.to_thread(fake.wait, lambda: len(fake.received) > mark, 30, "the held request")
            alive = await async_scheduler_client.ping()  # 2 s receive timeout inside sglang's client
            assert not held.done()
            fake.release()
            return alive, await held
        finally:
            async_scheduler_client.close()

    alive, out = asyncio.run(run())
    assert alive is True
    assert out.error is None and out.output[0]["actions"].shape == (4, 7)


def test_scheduler_failure_becomes_output_batch_error(fake_compat, sync_client):
    sa = fake_compat.server_args()
    out = sync_client(sa).forward(action_req(sa, observation(8), FAIL_PROMPT, 1))
    assert out.output is None
    assert "failed" in out.error and "worker_failed" in out.error and "the fake worker failed" in out.error


def test_unsupported_requests_get_clear_errors(fake_compat, sync_client):
    from sglang.multimodal_gen.runtime.entrypoints.control_requests import ListLorasReq, SetLoraReq
    from sglang.multimodal_gen.runtime.entrypoints.post_training.io_struct import GetWeightsChecksumReqInput

    sa = fake_compat.server_args()
    client = sync_client(sa)
    mark = fake_compat.fake.mark()
    assert "SetLoraReq is not supported by candidate_scheduler" in client.forward(SetLoraReq(lora_nickname="x")).error
    assert "ListLorasReq is not supported" in client.forward(ListLorasReq()).error
    assert "GetWeightsChecksumReqInput is not supported" in client.forward(GetWeightsChecksumReqInput()).error
    assert client.forward({"method": "other"}).error == "Unknown request type: <class 'dict'>"
    assert client.forward([]).error.endswith("request list cannot be empty")
    # a field the native protocol cannot carry is refused, not silently dropped
    req = action_req(sa, observation(9), "x", 1, flow_shift=3.0)
    assert "flow_shift is not supported" in client.forward(req).error
    # a grouped request may not also carry a candidate spec
    from sglang.multimodal_gen.runtime.pipelines_core.request_utils import expand_request_outputs

    parent = action_req(sa, observation(9), "x", 1, request_id="grp")
    parent.num_outputs_per_prompt = 2
    group = expand_request_outputs(parent)
    group[0].extra["candidates"] = {"count": 2}
    assert "cannot be combined" in client.forward(group).error
    # a video request is not an action request
    vreq = action_req(sa, observation(9), "x", 1)
    vreq.sampling_params.action_mode = None
    assert "Cosmos3 action requests only" in client.forward(vreq).error
    assert fake_compat.fake.since(mark) == []  # none of these reached the scheduler


def test_warmup_requests_get_an_empty_successful_reply(fake_compat, sync_client, tmp_path):
    from PIL import Image
    from sglang.multimodal_gen.runtime.server_warmup import build_client_warmup_reqs

    sa = fake_compat.server_args()
    client = sync_client(sa)
    mark = fake_compat.fake.mark()
    Image.fromarray(observation(10)).save(tmp_path / "warmup.png")
    # what `--warmup-mode server` sends at start-up
    warmups = build_client_warmup_reqs(sa, warmup_input_path=str(tmp_path / "warmup.png"))
    assert warmups and all(r.is_warmup and r.extra.get("return_warmup_result") for r in warmups)
    warmups.append(action_req(sa, observation(10), "x", 1).copy_as_warmup(1))
    for req in warmups:
        out = client.forward(req)
        assert out.error is None and out.output is None
    assert fake_compat.fake.since(mark) == []


def test_refused_pickle_does_not_stop_the_bridge(fake_compat, sync_client, tmp_path):
    """A gadget sent to the compat socket is refused (OutputBatch.error), never executed, and the next
    request is served. The same bytes run the command under plain pickle (see tests/unit)."""
    import pickle

    marker = tmp_path / "pwned"

    class Gadget:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    with raw_req_socket(fake_compat.endpoint, 10_000) as sock:
        sock.send(pickle.dumps(Gadget()))
        reply = pickle.loads(sock.recv())
    assert reply.error.startswith("refused: global posix.system") or reply.error.startswith("refused: global os.system")
    assert not marker.exists()
    client = sync_client(fake_compat.server_args())
    assert client.ping()


def test_shutdown_req_stops_only_the_bridge(own_bridge, fake_scheduler, compat_model_dir, sync_client):
    from sglang.multimodal_gen.runtime.entrypoints.control_requests import ShutdownReq

    from candidate_scheduler.compat.http import make_http_server_args

    bridge = own_bridge()
    sa = make_http_server_args(bridge.port, str(compat_model_dir))
    client = sync_client(sa)
    out = client.forward(ShutdownReq(), timeout_ms=10_000)
    assert out.error is None
    assert bridge.proc.wait(timeout=15) == 0
    assert fake_scheduler.shutdowns == 0  # the scheduler keeps running (no --shutdown-scheduler)


def test_shutdown_scheduler_flag_forwards(own_bridge, fake_scheduler, compat_model_dir, sync_client):
    from sglang.multimodal_gen.runtime.entrypoints.control_requests import ShutdownReq

    from candidate_scheduler.compat.http import make_http_server_args

    bridge = own_bridge("--control", fake_scheduler.control_endpoint, "--shutdown-scheduler")
    sa = make_http_server_args(bridge.port, str(compat_model_dir))
    before = fake_scheduler.shutdowns
    assert sync_client(sa).forward(ShutdownReq(), timeout_ms=10_000).error is None
    fake_scheduler.wait(lambda: fake_scheduler.shutdowns > before, 15, "SHUTDOWN on the control socket")
    assert bridge.proc.wait(timeout=15) == 0


def test_native_request_ids_are_unique(fake_compat, sync_client):
    """Two sglang requests with the same request_id are two groups (a native id sent again is a
    resubmission of the same group: core/resubmission.py)."""
    sa = fake_compat.server_args()
    mark = fake_compat.fake.mark()
    outs = forward_async(sa, [action_req(sa, observation(11), "dup", 1, request_id="same")],
                         [action_req(sa, observation(11), "dup", 2, request_id="same")])
    assert all(o.error is None for o in outs)
    sent = fake_compat.fake.since(mark)
    assert len({s.request_id for s in sent}) == 2 and all(s.request_id.startswith("sglang:same#") for s in sent)


def test_request_timeout_answers_and_cancels_the_group(own_bridge, fake_scheduler, compat_model_dir,
                                                                      sync_client):
    from candidate_scheduler.compat.http import make_http_server_args

    bridge = own_bridge("--control", fake_scheduler.control_endpoint, "--request-timeout", "1")
    sa = make_http_server_args(bridge.port, str(compat_model_dir))
    mark = fake_scheduler.mark()
    out = sync_client(sa).forward(action_req(sa, observation(12), HOLD_PROMPT, 1), timeout_ms=30_000)
    assert "no result within 1.0 s" in out.error
    [sent] = fake_scheduler.since(mark)
    fake_scheduler.wait(lambda: sent.request_id in fake_scheduler.cancels, 15, "the CANCEL of the timed-out group")


def test_max_message_size_is_enforced(own_bridge, fake_scheduler, compat_model_dir, sync_client):
    """MAXMSGSIZE drops an oversized message at the socket (no reply, the peer is disconnected); the
    bridge keeps serving."""
    import zmq

    from candidate_scheduler.compat.http import make_http_server_args

    bridge = own_bridge("--max-message-bytes", "4096")
    with raw_req_socket(bridge.endpoint, 1000) as sock:
        sock.send(b"\x80\x04" + b"x" * 10_000)
        with pytest.raises(zmq.Again):
            sock.recv()
    sa = make_http_server_args(bridge.port, str(compat_model_dir))
    assert sync_client(sa).ping()
