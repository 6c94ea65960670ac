"""`max_held_bytes` bounds the observations of groups waiting on the scheduler, not only the payloads.

Admission compared the PAYLOAD's size with the budget; once planned, a request's count was replaced by
its decoded observations without a check. A compressed image decodes to hundreds of times its bytes (a
3 MiB RGB frame of one colour is a few KB of PNG), so a burst of small requests was admitted under the
budget and then held many times it while waiting on the scheduler (up to max_in_flight x 32 MiB)."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest

from candidate_scheduler.compat.foreign import dumps_foreign
from candidate_scheduler.compat.unpickle import safe_loads
from tests.compat.test_bridge_held_bytes import _serving_bridge
from tests.unit.test_sglang_compat import req

pytestmark = pytest.mark.timeout(120)

SIDE = 1024
DECODED = SIDE * SIDE * 3  # what one observation holds while its group waits


def _small_payload_large_observation() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((SIDE, SIDE, 3), 7, np.uint8)).save(buf, format="PNG")
    payload = dumps_foreign(req(sp={"image_path": buf.getvalue()}))
    assert len(payload) * 50 < DECODED  # the point: the payload is far smaller than what it decodes to
    return payload


def test_observations_past_the_budget_are_answered_busy_not_held():
    payload = _small_payload_large_observation()
    budget = int(DECODED * 2.5)  # room for two observations; the six payloads fit many times over

    async def main():
        b, serving, c = _serving_bridge(max_held_bytes=budget)  # a scheduler that never answers
        try:
            for _ in range(6):
                c.send_multipart([b"", payload])
            errors = []
            while len(errors) < 4 and b.stats["forwarded"] < 6:
                if c.poll(0):
                    errors.append(safe_loads(c.recv_multipart()[-1]).__dict__.get("error"))
                else:
                    await asyncio.sleep(0.02)
            # every request is either waiting on the scheduler or answered
            while b.stats["forwarded"] + len(errors) < 6:
                if c.poll(0):
                    errors.append(safe_loads(c.recv_multipart()[-1]).__dict__.get("error"))
                else:
                    await asyncio.sleep(0.02)
            return b._held_bytes, b.stats["forwarded"], errors
        finally:
            b.stop()
            await serving
            b.close()
            c.close()

    held, forwarded, errors = asyncio.run(asyncio.wait_for(main(), 90))
    assert held <= budget, f"{held} bytes held for waiting groups with a budget of {budget}"
    assert forwarded == 2
    assert len(errors) == 4 and all("busy" in (e or "") for e in errors), errors


def test_one_request_whose_observations_are_over_the_budget_alone_is_still_forwarded():
    payload = _small_payload_large_observation()

    async def main():
        b, serving, c = _serving_bridge(max_held_bytes=DECODED // 2)
        try:
            c.send_multipart([b"", payload])
            while not b.stats["forwarded"] and not c.poll(0):
                await asyncio.sleep(0.02)
            return b.stats["forwarded"], b._held_bytes
        finally:
            b.stop()
            await serving
            b.close()
            c.close()

    forwarded, held = asyncio.run(asyncio.wait_for(main(), 90))
    assert forwarded == 1 and held == DECODED
