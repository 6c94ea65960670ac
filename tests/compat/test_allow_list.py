"""The static tables of the compat modules (allow-list, OutputBatch fields, enum members) against the
installed sglang 0.5.23, and every global that sglang's own request builders put in a pickle."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import pickle
import pkgutil

import msgspec
import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.compat.classify import Shutdown, classify
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.foreign import dumps_output_batch
from candidate_scheduler.compat.http import make_http_server_args
from candidate_scheduler.compat.mapping import plan_generation
from candidate_scheduler.compat.sglang_classes import (
    CONTROL_STRUCTS,
    ENUM_MEMBERS,
    OUTPUT_BATCH_DEFAULTS,
    POST_TRAINING_STRUCTS,
    SAMPLE,
    SAMPLING_AUX_CLASSES,
    SAMPLING_PARAMS_CLASSES,
    SGLANG_VERSION,
)
from candidate_scheduler.compat.unpickle import ALLOWED_GLOBALS, safe_loads

pytestmark = pytest.mark.sglang


def test_sglang_version():
    from importlib.metadata import version

    assert version("sglang") == SGLANG_VERSION


def test_sampling_params_classes_are_exactly_sglangs():
    import sglang.multimodal_gen.configs.sample as pkg
    from sglang.multimodal_gen.configs.sample.action import ActionSamplingParams
    from sglang.multimodal_gen.configs.sample.sampling_params import SamplingParams

    found: dict[str, set] = {}
    for m in pkgutil.iter_modules(pkg.__path__):
        try:
            mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
        except ImportError:
            continue
        for obj in vars(mod).values():
            if (inspect.isclass(obj) and obj.__module__ == mod.__name__
                    and issubclass(obj, (SamplingParams, ActionSamplingParams))):
                found.setdefault(m.name, set()).add(obj.__qualname__)
    assert {k: set(v) for k, v in SAMPLING_PARAMS_CLASSES.items()} == found
    for mod, names in SAMPLING_AUX_CLASSES.items():
        module = importlib.import_module(f"{SAMPLE}.{mod}")
        assert all(dataclasses.is_dataclass(getattr(module, n)) for n in names)


def test_output_batch_fields_and_defaults():
    from sglang.multimodal_gen.runtime.pipelines_core.schedule_batch import OutputBatch

    assert {f.name: f.default for f in dataclasses.fields(OutputBatch)} == OUTPUT_BATCH_DEFAULTS
    ob = pickle.loads(dumps_output_batch(error="x"))
    assert type(ob) is OutputBatch and vars(ob) == vars(OutputBatch(error="x"))


def test_enum_members_and_control_structs():
    from sglang.multimodal_gen.configs import task_type
    from sglang.multimodal_gen.runtime.entrypoints import control_requests
    from sglang.multimodal_gen.runtime.entrypoints.post_training import io_struct

    for qual, members in ENUM_MEMBERS.items():
        enum_cls = getattr(task_type, qual.rsplit(".", 1)[1])
        assert {m.value: m.name for m in enum_cls} == members
    structs = {n for n, o in vars(control_requests).items() if inspect.isclass(o) and issubclass(o, msgspec.Struct)
               and o.__module__ == control_requests.__name__}
    assert structs == set(CONTROL_STRUCTS)
    data = {n for n, o in vars(io_struct).items() if inspect.isclass(o) and dataclasses.is_dataclass(o)
            and o.__module__ == io_struct.__name__}
    assert data == set(POST_TRAINING_STRUCTS)
    for name in CONTROL_STRUCTS:  # the classes the allow-list names exist, and the stubs read them
        cls = getattr(control_requests, name)
        args = ("s",) if name in ("SetLoraReq", "ReleaseRealtimeSessionReq") else ()
        msg = classify(safe_loads(pickle.dumps(cls(*args))))
        assert isinstance(msg, Shutdown) if name == "ShutdownReq" else name in msg.error


class _Recorder(pickle.Unpickler):
    def __init__(self, data):
        super().__init__(io.BytesIO(data))
        self.seen = set()

    def find_class(self, module, name):
        self.seen.add((module, name))
        return super().find_class(module, name)


def _globals(obj, protocol):
    data = pickle.dumps(obj, protocol=protocol)
    r = _Recorder(data)
    r.load()
    return r.seen, data


def test_every_global_sglang_sends_is_allowed(compat_model_dir, tmp_path):
    from PIL import Image
    from sglang.multimodal_gen.configs.sample.cosmos3 import Cosmos3SamplingParams
    from sglang.multimodal_gen.configs.sample.sampling_params import SamplingParams
    from sglang.multimodal_gen.runtime.entrypoints.action.cosmos3 import build_cosmos3_action_sampling_params
    from sglang.multimodal_gen.runtime.entrypoints.utils import prepare_request
    from sglang.multimodal_gen.runtime.pipelines_core.request_utils import expand_request_outputs
    from sglang.multimodal_gen.runtime.server_warmup import build_client_warmup_reqs

    sa = make_http_server_args(1, str(compat_model_dir), batching_max_size=4)
    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    path = tmp_path / "o.png"
    Image.fromarray(img).save(path)
    params = {"height": 64, "width": 64, "num_inference_steps": 2, "action_horizon": 4, "domain_id": 0,
              "raw_action_dim": 7, "seed": 3}
    payloads = []
    for image in (img, Image.fromarray(img), str(path), [img, img]):
        sp = build_cosmos3_action_sampling_params({"request_id": "r", "parameters": params},
                                                  {"image": image, "prompt": "p"}, sa, Cosmos3SamplingParams)
        payloads.append(prepare_request(sa, sp))
    sp = SamplingParams.from_user_sampling_params_args(
        sa.model_path, server_args=sa, prompt="p", image_path=str(path), action_mode="policy", domain_id=0,
        raw_action_dim=7, num_frames=5, height=64, width=64, num_inference_steps=2, seed=3, num_outputs_per_prompt=2,
        diffusers_kwargs={"candidates": {"count": 2}})
    payloads.append(expand_request_outputs(prepare_request(sa, sp)))
    payloads.extend(build_client_warmup_reqs(sa, warmup_input_path=str(path)))
    named = {k: v for k, v in params.items() if k not in ("domain_id", "raw_action_dim")}
    named["domain_name"] = "droid_lerobot"
    sp = build_cosmos3_action_sampling_params({"request_id": "n", "parameters": named},
                                              {"image": img, "prompt": "p"}, sa, Cosmos3SamplingParams)
    payloads.append(prepare_request(sa, sp))
    for obj in payloads:
        for pickle_protocol in (2, 4, 5):
            seen, data = _globals(obj, pickle_protocol)
            assert seen <= set(ALLOWED_GLOBALS), seen - set(ALLOWED_GLOBALS)
            classify(safe_loads(data))
    # the batched one maps to one batched group; the expanded list to one offset group
    batched = plan_generation(classify(safe_loads(pickle.dumps(payloads[3]))).reqs)
    assert batched.batched and protocol.array_from_wire(batched.submit.images).shape == (2, 64, 64, 3)
    with pytest.raises(CompatError, match="cannot be combined"):
        plan_generation(classify(safe_loads(pickle.dumps(payloads[4]))).reqs)
    # sglang's builder passes domain_name on unresolved; the bridge resolves it as sglang's stage would
    named_plan = plan_generation(classify(safe_loads(pickle.dumps(payloads[-1]))).reqs)
    assert (named_plan.submit.sampling.domain_id, named_plan.submit.sampling.raw_action_dim) == (8, 10)


def test_http_server_args_pin_the_scheduler_hop_to_loopback(compat_model_dir):
    sa = make_http_server_args(45678, str(compat_model_dir), host="192.0.2.10", port=1)
    assert sa.scheduler_endpoints == ["tcp://127.0.0.1:45678"]
    assert make_http_server_args(45679, str(compat_model_dir), host="0.0.0.0").scheduler_endpoint == \
        "tcp://127.0.0.1:45679"
