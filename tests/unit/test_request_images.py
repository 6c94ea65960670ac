"""A group's observation must have pixels: an image with no rows or no columns is refused at receipt
(`invalid`, naming the images), not admitted to fail on a worker."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_engine import Harness


@pytest.mark.parametrize("shape, batched", [((0, 64, 3), False), ((64, 0, 3), False), ((2, 0, 8, 3), True)])
def test_an_image_of_no_pixels_is_refused_at_receipt(shape, batched):
    h = Harness()
    h.register("w1")
    h.submit("g", images=np.zeros(shape, np.uint8), batched=batched)
    r = h.reply("g")
    assert r.status == "invalid" and "pixel" in r.error, r
    assert not h.work and "g" not in h.engine.groups
