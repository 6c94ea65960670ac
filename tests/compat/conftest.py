"""Fixtures for the sglang compat tests: a compat bridge process in front of a native scheduler, and
sglang's own clients (imported once per test process).

Backends (env CSC_COMPAT_BACKEND):
- "service" (default): the session-scoped `service` fixture of tests/conftest.py (real scheduler,
  Cosmos3 worker and the bridge that `serve` spawns); `reference` is sglang's own pipeline, so count=1
  answers are checked bit for bit against sglang.
- "fake": `FakeScheduler`, a thread with a ZMQ ROUTER speaking the native protocol, answering
  each SUBMIT with deterministic actions = `fake_actions(image, prompt, sampling, seed)` per candidate.
  The bridge, the unpickler and sglang's clients are all real; only the scheduler and model are
  replaced. Fast, and needs no worker.
Tests that need to steer the scheduler (hold a request, fail it, see a cancel) always use the fake.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.core import reducers, rng
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.launcher import Launcher, child_env

ROOT = Path(__file__).resolve().parents[2]
ENV = child_env()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SGLANG_DISABLE_COSMOS3_GUARDRAILS", "1")

HOLD_PROMPT = "__hold__"
FAIL_PROMPT = "__fail__"


# ---- the fake native scheduler ----------------------------------------------------------------------


def fake_actions(image: np.ndarray, prompt: str, sampling: dict, seed: int) -> np.ndarray:
    """float32 [horizon, raw_action_dim], a deterministic function of everything that travels. The
    embodiment resolves as the real scheduler resolves it (unset: the native defaults)."""
    sampling = SamplingSpec(**sampling).to_dict()
    key = [seed & 0xFFFFFFFF, seed >> 32, zlib.crc32(prompt.encode()), zlib.crc32(np.ascontiguousarray(image).tobytes()),
           int(sampling["steps"]), int(sampling["height"]), int(sampling["width"]), int(sampling["domain_id"]),
           int(round(float(sampling["guidance_scale"]) * 1000)), int(sampling["fps"])]
    gen = np.random.default_rng(key)
    return gen.standard_normal((int(sampling["horizon"]), int(sampling["raw_action_dim"]))).astype(np.float32)


@dataclass
class Received:
    request: protocol.SubmitRequest
    at: float


class FakeScheduler:
    """Native request + control sockets on one thread. Holds requests whose prompt is HOLD_PROMPT
    until `release()`, fails FAIL_PROMPT ones, records every SUBMIT / CANCEL / SHUTDOWN."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.req = self.ctx.socket(zmq.ROUTER)
        self.ctl = self.ctx.socket(zmq.ROUTER)
        self.wake_out = self.ctx.socket(zmq.PAIR)
        self.wake_in = self.ctx.socket(zmq.PAIR)
        for s in (self.req, self.ctl, self.wake_out, self.wake_in):
            s.setsockopt(zmq.LINGER, 0)
        self.request_endpoint = f"tcp://127.0.0.1:{self.req.bind_to_random_port('tcp://127.0.0.1')}"
        self.control_endpoint = f"tcp://127.0.0.1:{self.ctl.bind_to_random_port('tcp://127.0.0.1')}"
        addr = f"inproc://fake-wake-{id(self)}"
        self.wake_in.bind(addr)
        self.wake_out.connect(addr)
        self.received: list[Received] = []
        self.cancels: list[str] = []
        self.shutdowns = 0
        self.event = threading.Condition()
        self._held: dict[str, tuple[bytes, protocol.SubmitRequest]] = {}
        self._commands: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fake-scheduler", daemon=True)
        self._thread.start()

    # -- test side
    def wait(self, predicate, timeout_s: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        with self.event:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"fake scheduler: timed out waiting for {what}")
                self.event.wait(remaining)

    def release(self) -> None:
        self._command("release")

    def mark(self) -> int:
        with self.event:
            return len(self.received)

    def since(self, mark: int) -> list[protocol.SubmitRequest]:
        with self.event:
            return [r.request for r in self.received[mark:]]

    def close(self) -> None:
        self._command("stop")
        self._thread.join(timeout=5)
        self.ctx.destroy(linger=0)

    def _command(self, cmd: str) -> None:
        self._commands.put(cmd)
        self.wake_out.send(b"")

    # -- scheduler side
    def _run(self) -> None:
        poller = zmq.Poller()
        for s in (self.req, self.ctl, self.wake_in):
            poller.register(s, zmq.POLLIN)
        while True:
            events = dict(poller.poll())
            if self.wake_in in events:
                self.wake_in.recv()
                cmd = self._commands.get()
                if cmd == "stop":
                    return
                for rid, (identity, request) in list(self._held.items()):
                    del self._held[rid]
                    self._answer(identity, self._result(request))
            if self.req in events:
                self._on_request(self.req.recv_multipart())
            if self.ctl in events:
                self._on_control(self.ctl.recv_multipart())

    def _on_request(self, frames: list[bytes]) -> None:
        identity, _delimited, kind, payload = protocol.split_envelope(frames, protocol.REQUEST_KINDS)
        msg = protocol.decode(kind, payload)
        if kind is protocol.Kind.PING:
            self.req.send_multipart([identity, *protocol.encode(protocol.Kind.PONG, protocol.Pong(msg.nonce))])
            return
        with self.event:
            self.received.append(Received(msg, time.monotonic()))
            self.event.notify_all()
        prompt = msg.prompt if isinstance(msg.prompt, str) else msg.prompt[0]
        if prompt == HOLD_PROMPT:
            self._held[msg.request_id] = (identity, msg)
            return
        self._answer(identity, self._result(msg))

    def _answer(self, identity: bytes, result: protocol.GroupResult) -> None:
        self.req.send_multipart([identity, *protocol.encode(protocol.Kind.RESULT, result)])

    def _result(self, msg: protocol.SubmitRequest) -> protocol.GroupResult:
        prompts = [msg.prompt] if isinstance(msg.prompt, str) else list(msg.prompt)
        if prompts[0] == FAIL_PROMPT:
            return protocol.GroupResult(request_id=msg.request_id, status="failed", error="the fake worker failed",
                                 error_code="worker_failed")
        images = protocol.array_from_wire(msg.images)
        if not msg.batched:
            images = images[None]
        if len(prompts) == 1:
            prompts = prompts * images.shape[0]
        spec = msg.candidates
        seeds = rng.candidate_seeds(msg.seed, spec.count, spec.seed_policy, spec.seeds)
        sampling = msgspec.structs.asdict(msg.sampling)
        cands = np.stack([
            np.stack([fake_actions(images[b], prompts[b], sampling, s) for b in range(images.shape[0])])
            for s in seeds
        ])  # [N, B, H, D]
        if not msg.batched:
            cands = cands[:, 0]
        reduction = reducers.reduce_full(spec.reducer, cands)
        return protocol.GroupResult(
            request_id=msg.request_id, status="done",
            action=None if reduction.action is None else protocol.array_to_wire(reduction.action),
            candidates=protocol.array_to_wire(cands) if (spec.return_candidates or spec.reducer == "none") else None,
            candidate_seeds=list(seeds), chosen_candidate=reduction.chosen_candidate,
        )

    def _on_control(self, frames: list[bytes]) -> None:
        identity, delimited, kind, payload = protocol.split_envelope(frames, protocol.CONTROL_KINDS)
        msg = protocol.decode(kind, payload)
        if kind is protocol.Kind.PING:  # as the real one's control socket: AsyncClient's liveness PINGs go there
            self.ctl.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG,
                                                          protocol.Pong(msg.nonce)))
            return
        changed = False
        if kind is protocol.Kind.CANCEL:
            held = self._held.pop(msg.request_id, None)
            changed = held is not None
            if held is not None:
                self._answer(held[0], protocol.GroupResult(request_id=msg.request_id, status="cancelled",
                                                    error="cancelled", error_code="cancelled"))
            with self.event:
                self.cancels.append(msg.request_id)
                self.event.notify_all()
        elif kind is protocol.Kind.SHUTDOWN:
            with self.event:
                self.shutdowns += 1
                self.event.notify_all()
        reply = protocol.ControlReply(ok=True, changed=changed)
        self.ctl.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.CONTROL_REPLY, reply))


# ---- the bridge process ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_scheduler():
    fake = FakeScheduler()
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def fake_bridge(fake_scheduler, tmp_path_factory):
    """One bridge in front of the fake scheduler, shared by the session (with --control)."""
    with Launcher(tmp_path_factory.mktemp("bridge")) as launcher:
        yield launcher.bridge(fake_scheduler.request_endpoint, "--control", fake_scheduler.control_endpoint)


@pytest.fixture
def own_bridge(fake_scheduler, tmp_path):
    """A bridge of the test's own (for tests that stop it or need other flags)."""
    with Launcher(tmp_path) as launcher:
        yield lambda *extra: launcher.bridge(fake_scheduler.request_endpoint, *extra)


# ---- what the tests run against ----------------------------------------------------------------------


@dataclass
class Compat:
    """The endpoint of a bridge, the checkpoint dir, and `reference(image, prompt, sampling, seed)`:
    the expected actions of one candidate with that seed (sglang's own pipeline for the real service)."""

    endpoint: str
    port: int
    model_dir: Path
    reference: object
    backend: str
    fake: FakeScheduler | None = None
    server_args_cache: dict = field(default_factory=dict)

    def server_args(self, **kwargs):
        """sglang ServerArgs whose scheduler endpoint is this bridge (what sglang's clients read)."""
        key = tuple(sorted(kwargs.items()))
        if key not in self.server_args_cache:
            from candidate_scheduler.compat.http import make_http_server_args

            self.server_args_cache[key] = make_http_server_args(self.port, str(self.model_dir), **kwargs)
        return self.server_args_cache[key]


@pytest.fixture(scope="session")
def compat_model_dir(request) -> Path:
    return request.getfixturevalue("model_dir")


@pytest.fixture(scope="session")
def compat(request, compat_model_dir) -> Compat:
    backend = os.environ.get("CSC_COMPAT_BACKEND", "service")
    if backend == "service":
        svc = request.getfixturevalue("service")
        port = int(svc.compat_endpoint.rsplit(":", 1)[1])
        return Compat(svc.compat_endpoint, port, Path(svc.model_dir), svc.reference, "service")
    fake = request.getfixturevalue("fake_scheduler")
    bridge = request.getfixturevalue("fake_bridge")
    return Compat(bridge.endpoint, bridge.port, compat_model_dir, fake_actions, "fake", fake)


@pytest.fixture(scope="session")
def fake_compat(request, compat_model_dir) -> Compat:
    """Always the fake backend (tests that hold, fail or count requests)."""
    fake = request.getfixturevalue("fake_scheduler")
    bridge = request.getfixturevalue("fake_bridge")
    return Compat(bridge.endpoint, bridge.port, compat_model_dir, fake_actions, "fake", fake)
