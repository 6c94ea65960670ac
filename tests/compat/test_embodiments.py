"""core.embodiments against the installed sglang 0.5.23: the vendored tables are sglang's, and
`resolve_embodiment` gives what sglang's own request builder and Cosmos3 latent stage give, with the
same error text, for every combination of domain_id / domain_name / raw_action_dim below."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from candidate_scheduler.compat.http import make_http_server_args
from candidate_scheduler.core import embodiments

pytestmark = pytest.mark.sglang


def test_tables_are_sglangs():
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages import cosmos3_action

    assert embodiments.EMBODIMENT_TO_DOMAIN_ID == cosmos3_action.EMBODIMENT_TO_DOMAIN_ID
    assert embodiments.EMBODIMENT_TO_RAW_ACTION_DIM == cosmos3_action.EMBODIMENT_TO_RAW_ACTION_DIM


def _sglang_resolve(sa, domain_id, domain_name, raw_action_dim):
    """What sglang does with these fields on its HTTP path: the action endpoint's Cosmos3 builder,
    then the latent stage's `_resolve_domain_id` and its raw_action_dim rule (the four lines of
    `_prepare_action_latents` that read it, which cannot run without a model)."""
    from sglang.multimodal_gen.configs.sample.cosmos3 import Cosmos3SamplingParams
    from sglang.multimodal_gen.runtime.entrypoints.action.cosmos3 import build_cosmos3_action_sampling_params
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3 import (
        Cosmos3LatentPreparationStage,
    )
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3_action import (
        get_raw_action_dim,
    )

    params = {"height": 64, "width": 64, "num_inference_steps": 2, "action_horizon": 4}
    for key, value in (("domain_id", domain_id), ("domain_name", domain_name), ("raw_action_dim", raw_action_dim)):
        if value is not None:
            params[key] = value
    image = np.zeros((64, 64, 3), np.uint8)
    try:
        sp = build_cosmos3_action_sampling_params({"parameters": params}, {"image": image, "prompt": "p"}, sa,
                                                  Cosmos3SamplingParams)
        resolved_id = Cosmos3LatentPreparationStage._resolve_domain_id(SimpleNamespace(sampling_params=sp))
        raw = sp.raw_action_dim
        if raw is None and sp.domain_name:
            raw = get_raw_action_dim(sp.domain_name)
    except ValueError as exc:
        return "error", str(exc)
    return "ok", (resolved_id, raw)


def _ours(domain_id, domain_name, raw_action_dim):
    try:
        return "ok", embodiments.resolve_embodiment(domain_id, domain_name, raw_action_dim)
    except ValueError as exc:
        return "error", str(exc)


def test_resolution_and_wording_match_sglang(compat_model_dir):
    sa = make_http_server_args(1, str(compat_model_dir))
    ids = (None, 0, 3, 31)
    names = (None, "", "droid_lerobot", " Droid_LeRobot ", "libero", "no_action", "agibotworld", "r2d2")
    widths = (None, 7, 10)
    compared = 0
    for domain_id, name, width in itertools.product(ids, names, widths):
        theirs = _sglang_resolve(sa, domain_id, name, width)
        assert _ours(domain_id, name, width) == theirs, (domain_id, name, width)
        compared += 1
    assert compared == len(ids) * len(names) * len(widths)
    # every name sglang knows, alone
    for name in embodiments.EMBODIMENT_TO_DOMAIN_ID:
        assert _ours(None, name, None) == _sglang_resolve(sa, None, name, None), name
