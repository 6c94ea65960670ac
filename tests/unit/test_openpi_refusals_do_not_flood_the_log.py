"""Handshakes without a valid token cost the front one log line per 10 s, not one each.

Anyone who reaches the openpi port could make the front write a warning per handshake refused for its
token (thousands a second, no token needed): a disk filled, and the lines that matter drowned. A robot
retrying in a loop with a revoked token did the same. The front already says "full" refusals at most
once per `FULL_LOG_EVERY_S`; token refusals now too, with the count since, and every one is counted in
its stats."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import pytest
import websockets
import websockets.asyncio.client

from candidate_scheduler.service import keys
from candidate_scheduler.service.openpi.front import FrontConfig, OpenpiFront


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_refused_tokens_are_counted_each_and_logged_once_a_while(tmp_path, caplog):
    keys.init_dir(tmp_path)
    token = keys.add_token(tmp_path, "robot")
    config = FrontConfig(_unused_endpoint(), None, port=0, tokens=keys.load_tokens(str(tmp_path)))
    attempts = 6

    async def run():
        front = OpenpiFront(config)
        url = await front.start()
        try:
            for k in range(attempts):
                headers = {} if k % 2 else {"Authorization": f"Bearer {token}-revoked"}
                with pytest.raises(websockets.InvalidStatus):
                    await websockets.asyncio.client.connect(url, additional_headers=headers, open_timeout=5)
            return dict(front.stats)
        finally:
            await front.close()

    caplog.set_level(logging.WARNING, logger="candidate_scheduler.service.openpi")
    try:
        stats = asyncio.run(run())
    finally:
        gc.collect()
    assert stats["unauthorized"] == attempts
    said = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(said) == 1, said  # before: one line per handshake
