"""A front that submits on behalf of each robot's token holder (it has scheduler keys) refuses, at the
handshake, a token the scheduler would never act for (an admin's or a proxy's: every observation came
back forbidden); and `serve` refuses a front token directory the scheduler does not read."""

from __future__ import annotations

import argparse
import asyncio
import gc
import socket

import pytest
import websockets
import websockets.asyncio.client
import zmq

from candidate_scheduler.core.access import Role
from candidate_scheduler.service import keys
from candidate_scheduler.service.openpi import launch, msgpack_numpy
from candidate_scheduler.service.openpi.front import FrontConfig, OpenpiFront
from candidate_scheduler.service.server import StartupRefused


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _handshake(tmp_path, role: Role, with_keys: bool):
    keys.init_dir(tmp_path)
    token = keys.add_token(tmp_path, "someone", role=role)
    server_public, _ = zmq.curve_keypair()
    config = FrontConfig(_unused_endpoint(), None, port=0, tokens=keys.load_tokens(str(tmp_path)),
                         keys=keys.ClientKeys.ephemeral(server_public) if with_keys else None)

    async def run():
        front = OpenpiFront(config)
        url = await front.start()
        try:
            ws = await websockets.asyncio.client.connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                                                         compression=None, max_size=None, open_timeout=5)
            meta = msgpack_numpy.unpackb(await ws.recv())
            await ws.close()
            return meta
        finally:
            await front.close()

    try:
        return asyncio.run(run())
    finally:
        gc.collect()


@pytest.mark.parametrize("role", [Role.ADMIN, Role.PROXY])
def test_a_token_the_scheduler_never_acts_for_is_refused_at_the_handshake(tmp_path, role):
    with pytest.raises(websockets.InvalidStatus) as refused:
        _handshake(tmp_path, role, with_keys=True)
    assert refused.value.response.status_code == 403
    assert b"client's token" in refused.value.response.body


def test_a_client_token_gets_in_and_without_keys_any_token_does(tmp_path):
    assert "server" in _handshake(tmp_path / "a", Role.CLIENT, with_keys=True)
    # without keys the front's groups are its own: the token only decides who gets in
    assert "server" in _handshake(tmp_path / "b", Role.ADMIN, with_keys=False)


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--curve-dir", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--insecure", action="store_true")
    launch.add_openpi_arguments(parser)
    return parser.parse_args(argv)


def test_serve_refuses_front_tokens_from_a_directory_the_scheduler_does_not_read(tmp_path):
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "other").mkdir()
    args = _serve_args("--curve-dir", str(tmp_path / "scheduler"), "--openpi-port", "0",
                       "--openpi-tokens", str(tmp_path / "other"))
    with pytest.raises(StartupRefused, match="is not --curve-dir"):
        launch.openpi_bind(args)
    # the same directory (spelt another way), or none given, is fine
    same = _serve_args("--curve-dir", str(tmp_path / "scheduler"), "--openpi-port", "0",
                       "--openpi-tokens", str(tmp_path / "other" / ".." / "scheduler"))
    assert launch.openpi_bind(same)[1] == str(tmp_path / "other" / ".." / "scheduler")
    assert launch.openpi_bind(_serve_args("--curve-dir", str(tmp_path / "scheduler"), "--openpi-port", "0"))[1] == \
        str(tmp_path / "scheduler")
