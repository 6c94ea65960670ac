"""The project's rule, "nothing listens off loopback without authentication unless the user says
--insecure", holds for an openpi front started from Python too, as it does for `run_http_server`.

The command line (`python -m candidate_scheduler.service.openpi`, `serve --openpi-port`) refuses the bind
before it builds a front (launch.bind_refusal), but `OpenpiFront(FrontConfig(host="0.0.0.0")).start()`
listened on every interface, without tokens and without a word. A host of None (asyncio: every
interface) or "" is public too."""

from __future__ import annotations

import asyncio
import gc
import socket

import pytest

from candidate_scheduler.service import keys
from candidate_scheduler.service.endpoints import is_loopback_host
from candidate_scheduler.service.openpi.front import FrontConfig, OpenpiFront


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _start(config: FrontConfig) -> str:
    async def run():
        front = OpenpiFront(config)
        try:
            return await front.start()
        finally:
            await front.close()

    try:
        return asyncio.run(run())
    finally:
        gc.collect()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", None])
def test_a_public_bind_without_tokens_is_refused_before_anything_listens(host):
    with pytest.raises(ValueError, match="insecure"):
        _start(FrontConfig(_unused_endpoint(), None, host=host, port=0))


def test_tokens_or_insecure_let_a_public_bind_through(tmp_path):
    keys.init_dir(tmp_path)
    keys.add_token(tmp_path, "robot")
    assert _start(FrontConfig(_unused_endpoint(), None, host="0.0.0.0", port=0,
                              tokens=keys.load_tokens(str(tmp_path)))).startswith("ws://0.0.0.0:")
    assert _start(FrontConfig(_unused_endpoint(), None, host="0.0.0.0", port=0, insecure=True)).startswith("ws://")
    assert _start(FrontConfig(_unused_endpoint(), None, port=0)).startswith("ws://127.0.0.1:")  # the default


def test_a_host_that_is_not_a_string_is_public():
    assert is_loopback_host(None) is False  # before: AttributeError
