"""The allow-list unpickler and the Req <-> group mapping of the compat modules, without sglang.

Every refusal test carries its own proof: the same payload (built for a different marker path) is run
through plain `pickle.loads` in a subprocess (`live_controls`) and must create its marker there, so a
payload that silently stopped being a working exploit would fail the test instead of passing it.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.compat.classify import Generation, Ping, Shutdown, Warmup, classify
from candidate_scheduler.compat.errors import CompatError, RefusedPickle
from candidate_scheduler.compat.foreign import ForeignObject, dumps_foreign
from candidate_scheduler.compat.images import image_to_rgb_array
from candidate_scheduler.compat.mapping import parse_candidate_spec, plan_generation
from candidate_scheduler.compat.replies import reply_for_result
from candidate_scheduler.compat.sglang_classes import CONTROL, OUTPUT_BATCH_DEFAULTS, SAMPLE, SCHEDULE_BATCH, TASK_TYPE
from candidate_scheduler.compat.unpickle import MAX_PICKLE_BYTES, OutputBatchStub, PILImageStub, ReqStub, safe_loads
from candidate_scheduler.service.endpoints import is_loopback_endpoint
from tests.unit.fresh_imports import heavy_modules_loaded

ROOT = Path(__file__).resolve().parents[2]

# ---- gadgets: each takes a marker path and returns a pickle that creates it when loaded by pickle.loads


def _reduce_pickle(callable_, args, protocol=4) -> bytes:
    class G:
        def __reduce__(self):
            return (callable_, args)

    return pickle.dumps(G(), protocol=protocol)


def g_os_system(path: Path) -> bytes:
    return _reduce_pickle(os.system, (f"touch {path}",))  # pickled as posix.system


def g_os_system_named(path: Path) -> bytes:  # spelled "os system", as hand-written exploits do
    return b"cos\nsystem\n(S'touch " + str(path).encode() + b"'\ntR."


def g_getattr_import(path: Path) -> bytes:
    # builtins.getattr(builtins.__import__('os'), 'system')('touch ...'): the published bypass of
    # sglang's deny-list unpickler
    return (b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR(S'touch "
            + str(path).encode() + b"'\ntR.")


def g_eval(path: Path) -> bytes:
    return b"cbuiltins\neval\n(S\"__import__('os').system('touch " + str(path).encode() + b"')\"\ntR."


def g_exec(path: Path) -> bytes:
    return b"cbuiltins\nexec\n(S\"import os; os.system('touch " + str(path).encode() + b"')\"\ntR."


def g_subprocess(path: Path) -> bytes:
    return _reduce_pickle(subprocess.Popen, (["touch", str(path)],))


def g_partial(path: Path) -> bytes:
    return _reduce_pickle(functools.partial(os.system, f"touch {path}"), ())


def g_copyreg(path: Path) -> bytes:
    # copyreg._reconstructor(cls, base, state) runs base.__init__(obj, state): here Popen(["touch", ...])
    import copyreg

    return _reduce_pickle(copyreg._reconstructor, (subprocess.Popen, subprocess.Popen, ["touch", str(path)]))


def g_inst_opcode(path: Path) -> bytes:  # protocol 0 INST: find_class + call, no REDUCE opcode
    return b"(S'touch " + str(path).encode() + b"'\nios\nsystem\n."


def g_inside_allowed(path: Path) -> bytes:  # a gadget nested in allowed containers
    gadget = ForeignObject("posix", "system", args=(f"touch {path}",), call=True)
    return dumps_foreign(ForeignObject("collections", "OrderedDict", args=([("k", {"x": [gadget]})],), call=True))


def g_torch_storage(path: Path) -> bytes:
    # torch.storage._load_from_bytes(b) is torch.load(b, weights_only=False): plain pickle inside
    return dumps_foreign(ForeignObject("torch.storage", "_load_from_bytes", args=(g_os_system(path),), call=True))


def g_numpy_reconstruct(path: Path) -> bytes:  # an allowed numpy function fed a forbidden callable
    return dumps_foreign(ForeignObject("numpy._core.multiarray", "_reconstruct", call=True,
                             args=(ForeignObject("posix", "system", args=(f"touch {path}",), call=True), (0,), b"b")))


GADGETS = {
    "os_system": (g_os_system, "posix.system"),
    "os_system_named": (g_os_system_named, "os.system"),
    "getattr_import": (g_getattr_import, "builtins.getattr"),
    "eval": (g_eval, "builtins.eval"),
    "exec": (g_exec, "builtins.exec"),
    "subprocess": (g_subprocess, "subprocess.Popen"),
    "partial": (g_partial, "functools.partial"),
    "copyreg": (g_copyreg, "copyreg._reconstructor"),
    "inst_opcode": (g_inst_opcode, "os.system"),
    "inside_allowed": (g_inside_allowed, "posix.system"),
    "numpy_reconstruct": (g_numpy_reconstruct, "posix.system"),
    "torch_storage": (g_torch_storage, "posix.system"),  # refused inside torch's weights-only loader
}

_CONTROL_SCRIPT = """
import pickle, sys, pathlib
for p in sys.argv[1:]:
    try:
        pickle.loads(pathlib.Path(p).read_bytes())
    except Exception:
        pass
"""


@pytest.fixture(scope="module")
def live_controls(tmp_path_factory) -> Path:
    """Runs every gadget, built for markers in its own directory, through plain pickle.loads in one
    subprocess: proof that each payload really executes."""
    root = tmp_path_factory.mktemp("control")
    files = []
    for name, (make, _) in GADGETS.items():
        f = root / f"{name}.pkl"
        f.write_bytes(make(root / f"{name}.marker"))
        files.append(str(f))
    subprocess.run([sys.executable, "-c", _CONTROL_SCRIPT, *files], cwd=root, check=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return root


@pytest.mark.parametrize("name", list(GADGETS))
def test_gadget_is_refused_and_never_runs(name, tmp_path, live_controls):
    make, global_named = GADGETS[name]
    assert (live_controls / f"{name}.marker").exists(), "the control payload did not execute: test is vacuous"
    marker = tmp_path / f"{name}.marker"
    with pytest.raises(RefusedPickle) as exc:
        safe_loads(make(marker))
    assert str(exc.value).startswith("refused:")
    if name != "torch_storage":
        assert global_named in str(exc.value)
    else:
        assert "weights_only" in str(exc.value)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_gadget_refused_in_every_protocol(protocol, tmp_path):
    marker = tmp_path / "m"
    payload = _reduce_pickle(os.system, (f"touch {marker}",), protocol=protocol)
    with pytest.raises(RefusedPickle):
        safe_loads(payload)
    assert not marker.exists()


def test_oversized_payload_is_refused_before_reading(tmp_path):
    marker = tmp_path / "m"
    payload = g_os_system(marker) + b"\0" * 2048
    with pytest.raises(RefusedPickle, match="over the 1024-byte limit"):
        safe_loads(payload, max_bytes=1024)
    assert not marker.exists()
    assert MAX_PICKLE_BYTES == protocol.MAX_MESSAGE_BYTES


@pytest.mark.parametrize("payload, match", [
    (b"P1\n.", "persistent"),
    (b"\x80\x04garbage", "unreadable"),
    (b"", "unreadable"),
    # allowed callables cannot be turned into allocation bombs or object arrays
    (b"cbuiltins\nbytearray\n(J\x00\xca\x9a;tR.", "bytearray takes only bytes"),
    (dumps_foreign(ForeignObject("numpy", "dtype", args=("O8", False, True), call=True)), "dtype"),
    (dumps_foreign(ForeignObject("numpy._core.numeric", "_frombuffer", call=True,
                       args=(b"\0" * 8, np.dtype("f4"), (10**6, 10**6), "C"))), "length does not match"),
    (dumps_foreign(ForeignObject("numpy", "ndarray", args=((10**6, 10**6),), call=True)), "unreadable"),
    (dumps_foreign(ForeignObject("PIL.Image", "Image", state=[{}, "RGB", (100_000, 100_000), None, b""])),
     "pixel limit"),
    (dumps_foreign(ForeignObject("PIL.Image", "Image", state=[{}, "RGB", (2, 2), None, b"\0" * 5])), "does not match"),
    (dumps_foreign(ForeignObject(SCHEDULE_BATCH, "Req", args=("x",), call=True)), "cannot be called"),
    (dumps_foreign(ForeignObject(SCHEDULE_BATCH, "Req", state={"__class__": 1})), "bad attribute"),
])
def test_malformed_or_abusive_payloads_are_refused(payload, match):
    with pytest.raises(RefusedPickle, match=match):
        safe_loads(payload)


def test_tensor_geometry_past_storage_is_refused():
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32)
    good = pickle.dumps(t)
    assert torch.equal(safe_loads(good), t)
    evil = dumps_foreign(ForeignObject("torch._utils", "_rebuild_tensor_v2", call=True, args=(
        ForeignObject("torch.storage", "_load_from_bytes", call=True, args=(_storage_bytes(t),)), 0, (1000,), (1,),
        False,
        __import__("collections").OrderedDict())))
    with pytest.raises(RefusedPickle, match="past its storage"):
        safe_loads(evil)


def _storage_bytes(t) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(t.storage(), buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def test_plain_data_survives():
    torch = pytest.importorskip("torch")
    data = {"a": [1, 2.5, "s", b"b", None, True], "s": {1, 2}, "f": frozenset({3}), "c": complex(1, 2),
            "arr": np.arange(6, dtype=np.float16).reshape(2, 3), "scalar": np.float32(1.5),
            "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)[:, 1:], "ba": bytearray(b"xy")}
    for pickle_protocol in range(6):
        out = safe_loads(pickle.dumps(data, protocol=pickle_protocol))
        assert out["a"] == data["a"] and out["s"] == {1, 2} and out["c"] == complex(1, 2)
        np.testing.assert_array_equal(out["arr"], data["arr"])
        assert out["scalar"] == np.float32(1.5) and out["ba"] == bytearray(b"xy")
        assert torch.equal(out["t"], data["t"])


# ---- sglang-shaped payloads, written without sglang -------------------------------------------------

COSMOS3 = (f"{SAMPLE}.cosmos3", "Cosmos3SamplingParams")
ACTION = ForeignObject(TASK_TYPE, "DataType", args=(4,), call=True)


def _image(seed=0, shape=(64, 64, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _pil_state(arr: np.ndarray):
    mode = {2: "L", 3: "RGB"}[arr.ndim] if arr.ndim == 2 or arr.shape[-1] == 3 else "RGBA"
    return ForeignObject("PIL.Image", "Image", state=[{}, mode, (arr.shape[1], arr.shape[0]), None, arr.tobytes()])


def sp_state(**over):
    state = {"data_type": ACTION, "action_mode": "policy", "prompt": "pick", "image_path": _pil_state(_image()),
             "seed": 5, "height": 64, "width": 64, "num_inference_steps": 2, "num_frames": 5, "guidance_scale": 1.0,
             "domain_id": 0, "raw_action_dim": 7, "fps": 5, "negative_prompt": "", "action_view_point": "ego_view",
             "action_normalization": "quantile", "flow_shift": None, "diffusers_kwargs": None, "request_id": "r1",
             "num_outputs_per_prompt": 1}
    state.update(over)
    return state


def req(sp=None, **over) -> ForeignObject:
    state = {"sampling_params": ForeignObject(*COSMOS3, sp_state(**(sp or {}))), "extra": {}, "is_warmup": False,
             "generator": None, "latents": None,
             "metrics": ForeignObject("sglang.multimodal_gen.runtime.utils.perf_logger", "RequestMetrics",
                          {"request_id": "r1", "stages": {}, "denoising_stages": set()}),
             "trace_ctx": ForeignObject("sglang.srt.observability.trace", "TraceNullContext",
                                        {"tracing_enable": False})}
    state.update(over)
    return ForeignObject(SCHEDULE_BATCH, "Req", state)


def load(obj):
    return safe_loads(dumps_foreign(obj))


def test_gadget_inside_a_req_is_refused(tmp_path):
    marker = tmp_path / "m"
    gadget = ForeignObject("posix", "system", args=(f"touch {marker}",), call=True)
    with pytest.raises(RefusedPickle, match="posix.system"):
        safe_loads(dumps_foreign(req(extra={"k": gadget})))
    assert not marker.exists()


def test_req_is_an_inert_stub_that_reads_through_to_sampling_params():
    r = load(req())
    assert isinstance(r, ReqStub) and r.__sglang_class__ == f"{SCHEDULE_BATCH}.Req"
    assert r.seed == 5 and r.prompt == "pick" and r.data_type.name == "ACTION"
    assert isinstance(r.image_path, PILImageStub)
    with pytest.raises(AttributeError):
        _ = r.not_a_field


def test_plain_req_maps_to_count_one():
    plan = plan_generation(classify(load(req())).reqs)
    s = plan.submit
    assert plan.kind == "single" and s.seed == 5 and s.prompt == "pick" and not s.batched
    assert (s.candidates.count, s.candidates.return_candidates) == (1, True)
    assert s.sampling == protocol.SamplingMsg(height=64, width=64, steps=2, horizon=4, guidance_scale=1.0, action_mode="policy",
                                       domain_id=0, raw_action_dim=7, fps=5, negative_prompt="")
    np.testing.assert_array_equal(protocol.array_from_wire(s.images), _image())
    assert s.request_id.startswith("sglang:r1#")


@pytest.mark.parametrize("where", ["extra", "extra_diffusers_kwargs", "sampling_params"])
def test_candidate_spec_locations(where):
    spec = {"count": 4, "reducer": "medoid", "return_candidates": True}
    if where == "extra":
        r = req(extra={"candidates": spec})
    elif where == "extra_diffusers_kwargs":
        r = req(extra={"diffusers_kwargs": {"candidates": spec}})
    else:
        r = req(sp={"diffusers_kwargs": {"candidates": spec}})
    plan = plan_generation(classify(load(r)).reqs)
    assert plan.kind == "candidates"
    assert (plan.submit.candidates.count, plan.submit.candidates.reducer, plan.submit.candidates.seed_policy) == (
        4, "medoid", "per_candidate")


def test_candidate_spec_conflicts_and_typos_are_errors():
    r = req(extra={"candidates": {"count": 2}}, sp={"diffusers_kwargs": {"candidates": {"count": 3}}})
    with pytest.raises(CompatError, match="two different candidate specs"):
        plan_generation(classify(load(r)).reqs)
    with pytest.raises(CompatError, match="bad candidate spec"):
        plan_generation(classify(load(req(extra={"candidates": {"count": 2, "reduce": "mean"}}))).reqs)
    assert parse_candidate_spec(3).count == 3


def test_expanded_list_is_one_offset_group_and_explicit_otherwise():
    def member(i, seed):
        return req(sp={"seed": seed, "request_id": f"p:{i}"}, extra={"parent_request_id": "p", "output_index": i})

    plan = plan_generation(classify(load([member(i, 10 + i) for i in range(3)])).reqs)
    assert plan.kind == "outputs" and plan.request_ids == ("p:0", "p:1", "p:2")
    c = plan.submit.candidates
    assert (c.count, c.seed_policy, c.reducer, c.return_candidates, plan.submit.seed) == (3, "offset", "none", True, 10)
    assert plan.submit.request_id.startswith("sglang:p#")
    assert plan.submit.api == "compat"  # counted as sglang's clients' (groups_received_total{api})
    plan = plan_generation(classify(load([member(0, 10), member(1, 99)])).reqs)
    assert (plan.submit.candidates.seed_policy, plan.submit.candidates.seeds) == ("explicit", [10, 99])
    with pytest.raises(CompatError, match="prompt differs"):
        plan_generation(classify(load([member(0, 1), req(sp={"prompt": "other", "seed": 2})])).reqs)


@pytest.mark.parametrize("field, value", [("flow_shift", 3.0), ("action_view_point", "third_person"),
                                          ("video_path", "/v.mp4"), ("rollout", True), ("action_fps", 10.0),
                                          ("guidance_interval", (400.0, 1000.0)),
                                          ("sound_duration", 1.5), ("share_vision_temporal_positions", False)])
def test_fields_the_native_protocol_cannot_carry_are_refused(field, value):
    with pytest.raises(CompatError, match=f"{field} is not supported"):
        plan_generation(classify(load(req(sp={field: value}))).reqs)


def test_non_action_and_non_policy_requests_are_refused():
    with pytest.raises(CompatError, match="Cosmos3 action requests only"):
        video = ForeignObject(TASK_TYPE, "DataType", args=(2,), call=True)
        plan_generation(classify(load(req(sp={"action_mode": None, "data_type": video}))).reqs)
    with pytest.raises(CompatError, match="inverse_dynamics"):
        plan_generation(classify(load(req(sp={"action_mode": "inverse_dynamics"}))).reqs)
    wan = ForeignObject(f"{SAMPLE}.wan", "WanT2V_1_3B_SamplingParams", sp_state())
    with pytest.raises(CompatError, match="Cosmos3 action requests only; got .*WanT2V"):
        wan_req = ForeignObject(SCHEDULE_BATCH, "Req", {"sampling_params": wan, "extra": {}})
        plan_generation(classify(load(wan_req)).reqs)


def test_classify_like_sglang():
    assert isinstance(classify(safe_loads(pickle.dumps({"method": "ping"}))), Ping)
    assert isinstance(classify(load(ForeignObject(CONTROL, "ShutdownReq", call=True))), Shutdown)
    set_lora = ForeignObject(CONTROL, "SetLoraReq", args=("n",), call=True)
    assert "SetLoraReq is not supported" in classify(load(set_lora)).error
    assert classify({"method": "x"}).error == "Unknown request type: <class 'dict'>"
    assert classify(load(ForeignObject(SCHEDULE_BATCH, "OutputBatch", {}))).error == \
        f"Unknown request type: <class '{SCHEDULE_BATCH}.OutputBatch'>"
    assert classify([1, 2]).error == "Unknown request group type: <class 'list'>"
    assert isinstance(classify(load([req()])), Generation)  # [Req] is one request
    assert isinstance(classify(load(req(is_warmup=True))), Warmup)
    assert isinstance(classify(load(req(extra={"server_internal_prewarm": True}))), Warmup)


def test_reply_is_an_output_batch_with_every_field():
    pytest.importorskip("torch")
    plan = plan_generation(classify(load(req(extra={"candidates": {"count": 3, "return_candidates": True}}))).reqs)
    cands = np.arange(3 * 4 * 7, dtype=np.float32).reshape(3, 4, 7)
    result = protocol.GroupResult(request_id=plan.submit.request_id, status="done", action=protocol.array_to_wire(cands.mean(0)),
                           candidates=protocol.array_to_wire(cands), candidate_seeds=[5, 6, 7])
    ob = safe_loads(reply_for_result(plan, result))  # our own reader accepts our own replies
    assert isinstance(ob, OutputBatchStub) and set(ob.__dict__) == set(OUTPUT_BATCH_DEFAULTS)
    [entry] = ob.output
    np.testing.assert_array_equal(entry["actions"], cands)
    np.testing.assert_array_equal(entry["reduced_actions"], cands.mean(0))
    assert entry["candidate_group"]["candidate_seeds"] == [5, 6, 7] and entry["request_id"] == "r1"
    assert entry["candidate_group"]["served_count"] == 3  # no elastic count: all of them
    elastic = protocol.GroupResult(request_id=plan.submit.request_id, status="done", served_count=2,
                                   action=protocol.array_to_wire(cands[:2].mean(0)),
                                   candidates=protocol.array_to_wire(cands[:2]), candidate_seeds=[5, 6])
    [few] = safe_loads(reply_for_result(plan, elastic)).output
    assert few["candidate_group"]["served_count"] == 2 and few["candidate_group"]["count"] == 3
    np.testing.assert_array_equal(few["actions"], cands[:2])
    assert tuple(ob.action_pred.shape) == (3, 4, 7) and ob.error is None
    failed = safe_loads(reply_for_result(plan, protocol.GroupResult(request_id="x", status="rejected", error="too big",
                                                                 error_code="does_not_fit")))
    assert failed.output is None and failed.error == "candidate_scheduler: group rejected [does_not_fit]: too big"


class Roundtrip:  # used by test_dumps_foreign_matches_pickle
    pass


def test_dumps_foreign_matches_pickle():
    obj = dumps_foreign(ForeignObject(__name__, "Roundtrip", {"a": 1, "arr": np.zeros(2)}))
    back = pickle.loads(obj)
    assert type(back) is Roundtrip and back.a == 1
    shared = ForeignObject(__name__, "Roundtrip", {"x": 1})
    a, b = pickle.loads(dumps_foreign([shared, shared]))
    assert a is b  # memoized like any pickled object
    with pytest.raises(pickle.PicklingError):
        dumps_foreign(ForeignObject("os; import x", "y", {}))


def test_observation_formats(tmp_path):
    from PIL import Image

    rgb = _image(1, (8, 6, 3))
    png = tmp_path / "o.png"
    Image.fromarray(rgb).save(png)
    data_url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    for source in (str(png), data_url, png.read_bytes(), rgb, safe_loads(pickle.dumps(Image.fromarray(rgb)))):
        np.testing.assert_array_equal(image_to_rgb_array(source), rgb)
    rgba = _image(2, (8, 6, 4))
    np.testing.assert_array_equal(image_to_rgb_array(rgba), np.asarray(Image.fromarray(rgba).convert("RGB")))
    gray = _image(3, (8, 6))
    np.testing.assert_array_equal(image_to_rgb_array(gray), np.asarray(Image.fromarray(gray).convert("RGB")))
    pal = Image.fromarray(rgb).convert("P")
    np.testing.assert_array_equal(image_to_rgb_array(safe_loads(pickle.dumps(pal))), np.asarray(pal.convert("RGB")))
    with pytest.raises(CompatError, match="does not fetch image URLs"):
        image_to_rgb_array("https://example.com/x.png")
    with pytest.raises(CompatError, match="not a readable image file"):
        image_to_rgb_array(str(tmp_path / "missing.png"))
    with pytest.raises(CompatError, match="uint8"):
        image_to_rgb_array(rgb.astype(np.float32))


def test_batched_observations():
    imgs = [_pil_state(_image(i)) for i in range(3)]
    plan = plan_generation(classify(load(req(sp={"image_path": imgs, "prompt": ["a", "b", "c"]}))).reqs)
    assert plan.batched and plan.submit.batched and plan.submit.prompt == ["a", "b", "c"]
    assert protocol.array_from_wire(plan.submit.images).shape == (3, 64, 64, 3)


def test_loopback_detection():
    assert is_loopback_endpoint("tcp://127.0.0.1:5558") and is_loopback_endpoint("ipc:///tmp/x")
    assert is_loopback_endpoint("tcp://localhost:1") and is_loopback_endpoint("tcp://[::1]:1")
    assert not is_loopback_endpoint("tcp://0.0.0.0:5558") and not is_loopback_endpoint("tcp://*:5558")
    assert not is_loopback_endpoint("tcp://10.0.0.2:5558")


def test_bridge_refuses_a_public_bind_without_the_flag():
    out = subprocess.run([sys.executable, "-m", "candidate_scheduler.compat.bridge", "--bind", "tcp://0.0.0.0:0",
                          "--scheduler", "tcp://127.0.0.1:1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode != 0 and "refusing to bind" in out.stderr + out.stdout


# ---- domain_name, resolved as sglang resolves it ------------------------------------------------------

NAME_ONLY = {"domain_id": None, "raw_action_dim": None}


def _sampling_of(**sp) -> protocol.SamplingMsg:
    return plan_generation(classify(load(req(sp=sp))).reqs).submit.sampling


def test_domain_name_alone_is_resolved_like_sglang():
    plan = plan_generation(classify(load(req(sp={**NAME_ONLY, "domain_name": "droid_lerobot"}))).reqs)
    s = plan.submit.sampling
    assert (s.domain_id, s.raw_action_dim) == (8, 10)
    assert (plan.domain_id, plan.raw_action_dim) == (8, 10)  # what the OutputBatch reports
    if "domain_name" in protocol.SamplingMsg.__struct_fields__:  # the worker hands the name on to sglang
        assert s.domain_name == "droid_lerobot"


def test_domain_id_wins_and_the_width_comes_from_the_name():
    s = _sampling_of(domain_id=3, raw_action_dim=None, domain_name=" Droid_LeRobot ")
    assert (s.domain_id, s.raw_action_dim) == (3, 10)
    s = _sampling_of(domain_id=None, raw_action_dim=7, domain_name="droid_lerobot")
    assert (s.domain_id, s.raw_action_dim) == (8, 7)


@pytest.mark.parametrize("sp, message", [
    ({**NAME_ONLY, "domain_name": "r2d2"}, "Unknown action domain name 'r2d2'. Valid names: ["),
    ({**NAME_ONLY, "domain_name": "libero"}, "No raw action dim for Cosmos3 embodiment 'libero'. Expected one of ["),
    ({**NAME_ONLY, "domain_id": 0}, "raw_action_dim is required when only domain_id is provided"),
    (NAME_ONLY, "Cosmos3 action requests require domain_name or domain_id"),
    ({**NAME_ONLY, "domain_name": 8}, "domain_name must be a string, got int"),
    ({"domain_id": "8"}, "domain_id must be an int, got str"),
])
def test_embodiment_refusals_use_sglangs_wording(sp, message):
    with pytest.raises(CompatError) as exc:
        _sampling_of(**sp)
    assert str(exc.value).startswith(message)


def test_grouped_requests_must_share_the_domain_name():
    def member(i, name):
        return req(sp={**NAME_ONLY, "domain_name": name, "seed": i, "request_id": f"p:{i}"})

    plan = plan_generation(classify(load([member(0, "droid_lerobot"), member(1, "droid_lerobot")])).reqs)
    assert plan.submit.sampling.raw_action_dim == 10 and plan.submit.candidates.count == 2
    with pytest.raises(CompatError, match="domain_name differs"):
        plan_generation(classify(load([member(0, "droid_lerobot"), member(1, "umi")])).reqs)


def test_the_bridge_imports_neither_sglang_nor_torch():
    modules = ["candidate_scheduler.compat.bridge", "candidate_scheduler.compat.replies", "candidate_scheduler.compat.http"]
    assert heavy_modules_loaded(modules, ("sglang", "torch", "PIL")) == []
