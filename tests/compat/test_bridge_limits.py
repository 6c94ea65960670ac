"""What one client can make the bridge do to the others: requests over the scheduler's message limit,
grouped requests of a million Reqs, image paths that block. Each is refused to its sender alone."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from candidate_scheduler import protocol
from candidate_scheduler.compat.classify import Answer, classify
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.foreign import ForeignObject, dumps_foreign
from candidate_scheduler.compat.mapping import plan_generation
from candidate_scheduler.compat.unpickle import safe_loads
from tests.unit.test_sglang_compat import load, req

# ---- over the scheduler's limits: refused by the bridge, never sent --------------------------------


def test_observations_over_the_scheduler_limit_are_refused():
    # two 3000x3000 RGB frames: 54 MB, over MAX_OBSERVATION_BYTES (the scheduler would refuse them, and the
    # SUBMIT would be near its 64 MiB message limit)
    big = np.zeros((3000, 3000, 3), dtype=np.uint8)
    assert 2 * big.nbytes > protocol.MAX_OBSERVATION_BYTES
    msg = classify(load(req(sp={"image_path": [big, big], "prompt": "pick"})))
    with pytest.raises(CompatError, match="bytes"):
        plan_generation(msg.reqs)


def test_a_submit_over_the_message_limit_is_refused():
    # each part under its own limit, the SUBMIT over the message limit: 31.7 MB of observations (two
    # 2300x2300 frames, a few KB as PNG in the pickle) and a 36 MB prompt
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (2300, 2300)).save(png, format="PNG")
    prompt = "x" * 36_000_000
    msg = classify(load(req(sp={"image_path": [png.getvalue()] * 2, "prompt": prompt})))
    with pytest.raises(CompatError, match="over the scheduler's limit"):
        plan_generation(msg.reqs)


def test_a_pil_batch_over_the_limit_is_refused():
    # the review's reproduction: mode "1" images are 1 MB in the pickle and 24 MB each as RGB
    w, h = 4000, 2000
    img = ForeignObject("PIL.Image", "Image", state=[{}, "1", (w, h), None, b"\xaa" * ((w + 7) // 8 * h)])
    msg = classify(load(req(sp={"image_path": [img, img, img], "prompt": "pick"})))
    with pytest.raises(CompatError, match="bytes"):
        plan_generation(msg.reqs)


# ---- grouped requests: counted before any per-Req work ----------------------------------------------


def test_a_grouped_request_of_a_million_reqs_is_refused_at_once():
    r = req()
    payload = dumps_foreign([r] * 1_000_000)  # each extra element is a memo reference: ~5 MB of pickle
    obj = safe_loads(payload)
    started = time.perf_counter()
    msg = classify(obj)
    assert isinstance(msg, Answer) and "at most" in msg.error
    assert time.perf_counter() - started < 0.5  # classify runs on the event loop: no per-Req pass
    started = time.perf_counter()
    with pytest.raises(CompatError, match="at most"):  # and plan_generation counts first too
        plan_generation(tuple(obj))
    assert time.perf_counter() - started < 0.5


def test_a_grouped_request_at_the_limit_still_plans():
    reqs = [req(sp={"seed": 42 + i}) for i in range(protocol.MAX_CANDIDATES)]
    plan = plan_generation(classify(load(reqs)).reqs)
    assert plan.kind == "outputs" and plan.spec.count == protocol.MAX_CANDIDATES


# ---- image paths that are not regular files ------------------------------------------------------


def test_fifo_image_path_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "obs.png"
    os.mkfifo(fifo)
    msg = classify(load(req(sp={"image_path": str(fifo)})))
    out = {}

    def run():
        try:
            plan_generation(msg.reqs)
            out["r"] = "planned"
        except CompatError as exc:
            out["r"] = str(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    alive = t.is_alive()
    if alive:  # unblock the thread
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not alive, "plan_generation blocked on a FIFO image_path (an executor thread held forever)"
    assert "not a readable image file" in out["r"]


def test_a_directory_image_path_is_refused(tmp_path):
    msg = classify(load(req(sp={"image_path": str(tmp_path)})))
    with pytest.raises(CompatError, match="not a readable image file"):
        plan_generation(msg.reqs)
