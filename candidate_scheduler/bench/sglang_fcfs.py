"""sglang's own Cosmos3 pipeline serving one candidate per request, first come first served, behind the
native protocol: the `sglang_sequential` arm of the load benchmark and its parity reference.

    python -m candidate_scheduler.bench.sglang_fcfs --model DIR [--device cpu] [--bind tcp://127.0.0.1:0]
        [--insecure: allow --bind off loopback; neither socket has authentication]

This is what a user has today without this scheduler: each candidate of a group is its own sglang
request (`sglang_reference_actions` with that candidate's seed), served in arrival order, one at a
time. Speaking the native protocol (SUBMIT -> RESULT, PING -> PONG on one ROUTER, CANCEL on a control
ROUTER beside it) lets the load generator drive every arm with the same client, and stop the work a
load point sent once its verdict is known, as it does on the scheduler. A group's reply carries every
candidate, the group's reduced action, and `first_step_s` (receipt to the first denoise step of its
first candidate) and `rows_per_forward` (always 1) in its metrics.

Two threads, as in the worker: the main thread owns the socket (receipt times are taken as requests
arrive, not when the compute thread gets to them), the compute thread runs the pipeline.
"""

from __future__ import annotations

import argparse
import logging
import queue
import sys
import threading
import time

import numpy as np
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.core import reducers, rng
from candidate_scheduler.core.work import SamplingSpec
from candidate_scheduler.service.endpoints import bind_socket

READY_PREFIX = "sglang-fcfs: listening on"  # then the request endpoint, "control", the control endpoint
_WAKE = "inproc://sglang-fcfs-results"


def sampling_spec(msg: protocol.SamplingMsg) -> SamplingSpec:
    return SamplingSpec(height=msg.height, width=msg.width, steps=msg.steps, horizon=msg.horizon,
                        guidance_scale=float(msg.guidance_scale), action_mode=msg.action_mode,
                        domain_id=msg.domain_id, raw_action_dim=msg.raw_action_dim, fps=msg.fps,
                        negative_prompt=msg.negative_prompt)


class FirstDenoiseClock:
    """Records when the pipeline's denoising stage is next entered (the first denoise step of a call)."""

    def __init__(self, pipeline):
        self.entered_at: float | None = None
        for stage in pipeline.stages:
            if "Denois" in type(stage).__name__:
                self._wrap(stage)
                break

    def _wrap(self, stage) -> None:
        forward = stage.forward

        def timed(*args, **kwargs):
            if self.entered_at is None:
                self.entered_at = time.monotonic()
            return forward(*args, **kwargs)

        stage.forward = timed


class FcfsServer:
    def __init__(self, model: str, device: str, bind: str):
        from candidate_scheduler.bench.inprocess import quiet_sglang
        from candidate_scheduler.worker.cosmos3 import load_sglang_pipeline

        self.pipeline, self.server_args = load_sglang_pipeline(model, device)
        quiet_sglang()
        self.clock = FirstDenoiseClock(self.pipeline)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        if bind.endswith(":0"):
            port = self.sock.bind_to_random_port(bind.rsplit(":", 1)[0])
            self.endpoint = f"{bind.rsplit(':', 1)[0]}:{port}"
        else:
            self.sock.bind(bind)
            self.endpoint = bind
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control_endpoint = bind_socket(self.control, f"{self.endpoint.rsplit(':', 1)[0]}:0")
        # request ids received and not answered yet, and those of them a CANCEL asked to stop (the IO thread
        # adds, the compute thread reads and removes: single set operations, atomic under the GIL)
        self.live: set[str] = set()
        self.cancelled: set[str] = set()
        self.wake_in = self.ctx.socket(zmq.PAIR)
        self.wake_in.bind(_WAKE)
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()

    # ---- compute thread ---------------------------------------------------------------------------------
    def _compute(self) -> None:
        from candidate_scheduler.worker.cosmos3 import sglang_reference_actions

        wake = self.ctx.socket(zmq.PAIR)
        wake.connect(_WAKE)
        while True:
            job = self.jobs.get()
            if job is None:
                return
            identity, delimited, msg, received_at = job
            try:
                result = self._run_group(msg, received_at, sglang_reference_actions)
            except Exception as exc:  # noqa: BLE001 - answered as a failed group; the server keeps serving
                result = protocol.GroupResult(request_id=msg.request_id, status="failed",
                                              error=f"{type(exc).__name__}: {exc}", error_code="model_error")
            self.cancelled.discard(msg.request_id)
            self.live.discard(msg.request_id)
            self.results.put(protocol.reply_frames(identity, delimited, protocol.Kind.RESULT, result))
            wake.send(b"")

    def _run_group(self, msg: protocol.SubmitRequest, received_at: float, reference) -> protocol.GroupResult:
        if msg.batched:
            raise ValueError("one observation per group only")
        sampling = sampling_spec(msg.sampling)
        image = protocol.array_from_wire(msg.images)
        prompt = msg.prompt if isinstance(msg.prompt, str) else msg.prompt[0]
        spec = msg.candidates
        seeds = rng.candidate_seeds(msg.seed, spec.count, spec.seed_policy, spec.seeds)
        started = time.monotonic()
        self.clock.entered_at = None
        candidates = []
        for seed in seeds:  # each candidate its own sglang request, in order
            if msg.request_id in self.cancelled:  # asked to stop: before its next candidate, as the worker does
                return protocol.GroupResult(request_id=msg.request_id, status="cancelled",
                                            metrics={"queue_wait_s": started - received_at})
            candidates.append(reference(self.pipeline, self.server_args, image, prompt, sampling, seed))
        first_step = self.clock.entered_at  # set by the first candidate's call only
        stacked = np.stack(candidates).astype(np.float32)
        reduction = reducers.reduce_full(spec.reducer, stacked)
        done = time.monotonic()
        return protocol.GroupResult(
            request_id=msg.request_id, status="done",
            action=None if reduction.action is None else protocol.array_to_wire(reduction.action),
            candidates=protocol.array_to_wire(stacked) if (spec.return_candidates or spec.reducer == "none") else None,
            candidate_seeds=list(seeds), chosen_candidate=reduction.chosen_candidate,
            metrics={"queue_wait_s": started - received_at, "total_s": done - received_at,
                     "first_step_s": None if first_step is None else first_step - received_at,
                     "rows_per_forward": 1.0, "physical_forwards": sampling.steps * len(seeds)},
        )

    # ---- IO (main) thread ---------------------------------------------------------------------------------
    def serve(self) -> None:
        threading.Thread(target=self._compute, name="compute", daemon=True).start()
        print(f"{READY_PREFIX} {self.endpoint} control {self.control_endpoint}", flush=True)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        poller.register(self.wake_in, zmq.POLLIN)
        while True:
            events = dict(poller.poll())
            if self.wake_in in events:
                self.wake_in.recv()
                self.sock.send_multipart(self.results.get())
            if self.sock in events:
                self._on_request(self.sock.recv_multipart())
            if self.control in events:
                self._on_control(self.control.recv_multipart())

    def _on_request(self, frames: list[bytes]) -> None:
        received_at = time.monotonic()
        try:
            identity, delimited, kind, payload = protocol.split_envelope(frames, protocol.REQUEST_KINDS)
            msg = protocol.decode(kind, payload)
        except protocol.ProtocolError:
            return  # the benchmark sends only valid messages; nothing to answer an unreadable one with
        if kind is protocol.Kind.PING:
            self.sock.send_multipart(protocol.reply_frames(identity, delimited, protocol.Kind.PONG,
                                                           protocol.Pong(msg.nonce)))
            return
        self.live.add(msg.request_id)
        self.jobs.put((identity, delimited, msg, received_at))

    def _on_control(self, frames: list[bytes]) -> None:
        """CANCEL (a queued group is answered `cancelled` when its turn comes, a running one before its next
        candidate) and PING; any other control request is refused."""
        try:
            identity, delimited, kind, payload = protocol.split_envelope(frames, protocol.CONTROL_KINDS)
            msg = protocol.decode(kind, payload)
        except protocol.ProtocolError:
            return
        if kind is protocol.Kind.PING:
            reply, out = protocol.Pong(msg.nonce), protocol.Kind.PONG
        elif kind is protocol.Kind.CANCEL:
            known = msg.request_id in self.live
            if known:
                self.cancelled.add(msg.request_id)
            reply, out = protocol.ControlReply(ok=True, changed=known, state="live" if known else "unknown"), \
                protocol.Kind.CONTROL_REPLY
        else:
            reply, out = protocol.ControlReply(ok=False, error=f"{kind.name} is not served here"), \
                protocol.Kind.CONTROL_REPLY
        self.control.send_multipart(protocol.reply_frames(identity, delimited, out, reply))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m candidate_scheduler.bench.sglang_fcfs", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="Cosmos3 checkpoint directory")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    parser.add_argument("--bind", default="tcp://127.0.0.1:0", help="ROUTER endpoint (default: loopback, any free port)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow --bind off loopback: its request and control sockets have no authentication")
    args = parser.parse_args(argv)
    from candidate_scheduler.service.endpoints import is_loopback_endpoint

    if not is_loopback_endpoint(args.bind) and not args.insecure:
        parser.error(f"--bind {args.bind} is off loopback and this server has no authentication; "
                     "add --insecure to serve it there anyway")
    logging.basicConfig(level=logging.WARNING)
    server = FcfsServer(args.model, args.device, args.bind)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
