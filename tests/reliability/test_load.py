"""Load and soak.

Load: many concurrent clients against a scheduler with a small bounded queue (--max-queued-groups):
every request gets exactly one reply -- a result or `overloaded` -- and none is lost, duplicated, or a
partial aggregate (a done reply always carries the full, fault-free action of the right shape).

Soak: a mixed workload (groups of every shape, cancels, status, malformed messages, overload, client
connection churn) for a while; the scheduler's RSS and open file descriptors must stay flat after
warm-up.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time

import msgspec
import pytest
import zmq
import zmq.asyncio

from candidate_scheduler import protocol
from tests.reliability.helpers import (
    Ledger,
    proc_fds,
    proc_rss_kb,
    random_request,
    stats,
    wait_quiescent,
)

pytestmark = pytest.mark.timeout(1200)


class AsyncPeer:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        self.sock.connect(endpoint)
        self.nonce = 0

    async def recv(self, timeout_s: float):
        frames = await asyncio.wait_for(self.sock.recv_multipart(), timeout_s)
        return protocol.decode_frames(frames, {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG, protocol.Kind.CONTROL_REPLY})

    async def barrier(self, ledger: Ledger, timeout_s: float = 10.0) -> None:
        """PING, and take every RESULT queued before the PONG."""
        self.nonce += 1
        await self.sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(self.nonce)))
        while True:
            kind, msg = await self.recv(timeout_s)
            if kind is protocol.Kind.PONG and msg.nonce == self.nonce:
                return
            if kind is protocol.Kind.RESULT:
                ledger.got(msg)

    def close(self) -> None:
        self.sock.close(0)


async def _client(ctx, endpoint: str, cid: int, n: int, window: int, ledger: Ledger, rnd: random.Random,
                  stop_at: float | None = None, churn_every: int = 0, reply_timeout_s: float = 60.0,
                  retry_overloaded: int = 0, recent=None) -> dict:
    """One client: up to `window` groups in flight; `n` groups (or until `stop_at`). An `overloaded`
    group is sent again under a new id up to `retry_overloaded` times (what a real client does)."""
    peer = AsyncPeer(ctx, endpoint)
    pending: set[str] = set()
    sent = 0
    reconnects = 0
    next_churn = churn_every
    retries: list[protocol.SubmitRequest] = []
    try:
        while True:
            more = sent < n if stop_at is None else time.monotonic() < stop_at
            draining = bool(churn_every) and sent >= next_churn  # let pending drain, then reconnect
            while (more or retries) and not draining and len(pending) < window:
                if retries:
                    req = retries.pop()
                else:
                    req = random_request(rnd, request_id=f"c{cid}-{sent}", max_count=12, steps=(1, 4))
                    sent += 1
                ledger.sent(req)
                if recent is not None:
                    recent.append(req.request_id)
                await peer.sock.send_multipart(protocol.encode(protocol.Kind.SUBMIT, req))
                pending.add(req.request_id)
                more = sent < n if stop_at is None else time.monotonic() < stop_at
                draining = bool(churn_every) and sent >= next_churn
            if not pending:
                if not more and not retries:
                    break
                if not draining:
                    continue
            if pending:
                try:
                    kind, msg = await peer.recv(reply_timeout_s)
                except TimeoutError:
                    break  # whatever is pending now is lost; the ledger says so
            else:
                kind = None
            if kind is protocol.Kind.RESULT:
                ledger.got(msg)
                pending.discard(msg.request_id)
                if msg.status == "overloaded":
                    await asyncio.sleep(rnd.uniform(0.0, 0.01))  # pacing, not ordering
                    base, _, k = msg.request_id.partition(".r")
                    if int(k or 0) < retry_overloaded:
                        old = ledger.requests[msg.request_id]
                        retries.append(msgspec.structs.replace(old, request_id=f"{base}.r{int(k or 0) + 1}"))
            if churn_every and not pending and sent >= next_churn:
                next_churn = sent + churn_every
                await peer.barrier(ledger)
                peer.close()
                peer = AsyncPeer(ctx, endpoint)  # a new connection (new identity) from the same client
                reconnects += 1
        return {"peer": peer, "sent": sent, "reconnects": reconnects}
    except BaseException:
        peer.close()
        raise


async def _run_clients(endpoint: str, clients: int, per_client: int, window: int, seed: int, ledger: Ledger,
                       handle=None, duration_s: float | None = None, churn_every: int = 0, retry_overloaded: int = 0,
                       recent=None):
    ctx = zmq.asyncio.Context()
    try:
        stop_at = None if duration_s is None else time.monotonic() + duration_s
        results = await asyncio.gather(*[
            _client(ctx, endpoint, i, per_client, window, ledger, random.Random(seed * 7919 + i), stop_at, churn_every,
                    retry_overloaded=retry_overloaded, recent=recent)
            for i in range(clients)
        ])
        if handle is not None:
            await asyncio.to_thread(wait_quiescent, handle, 60)
        for r in results:  # after quiescence, nothing else may arrive: the PING barrier proves it
            await r["peer"].barrier(ledger)
            r["peer"].close()
        return results
    finally:
        ctx.term()


def test_load_bounded_queue_exactly_once(services, reliability, rng_seed):
    s = reliability.scale
    max_queued = 8
    sched = services.scheduler("--max-queued-groups", str(max_queued))
    for _ in range(2):
        services.worker(sched, capacity=8)
    sched.wait_workers(2)
    ledger = Ledger()
    t0 = time.monotonic()
    asyncio.run(_run_clients(sched.request, s.load_clients, s.load_groups, 2, rng_seed, ledger, handle=sched,
                             retry_overloaded=10_000))
    elapsed = time.monotonic() - t0
    st = stats(sched)
    assert st["handler_errors"] == 0 and st["groups_in_flight"] == 0 and st["batches_in_flight"] == 0
    summary = ledger.summary()
    done, over = ledger.statuses["done"], ledger.statuses["overloaded"]
    groups = s.load_clients * s.load_groups
    reliability.add("load", f"{s.load_clients} concurrent clients x {s.load_groups} groups (window 2, counts 1-12, "
                    f"4 reducers; an overloaded group is resent under a new id), --max-queued-groups {max_queued}, "
                    f"2 null workers", summary["requests"],
                    f"all {groups} groups done (none starved); {summary['replies']} replies in {elapsed:.1f} s: "
                    f"done {done}, overloaded {over}, other "
                    f"{summary['replies'] - done - over}; lost {summary['lost']}, duplicated {summary['duplicated']}, "
                    f"partial aggregates {summary['partial_aggregates']}, wrong {summary['wrong_results']}")
    ledger.assert_clean(reliability)
    assert done + over == summary["requests"], ledger.statuses
    assert over > 0, ledger.statuses  # the bound was hit
    assert done == groups, f"{groups - done} groups never got through (starved by overload): {ledger.statuses}"


async def _noise(handle, stop_at: float, rnd: random.Random, counts: dict, recent) -> None:
    """Control traffic and malformed messages next to the load: cancels, status, stats, garbage."""
    ctx = zmq.asyncio.Context()
    ctl = AsyncPeer(ctx, handle.control)
    junk = AsyncPeer(ctx, handle.request)
    try:
        while time.monotonic() < stop_at:
            r = rnd.random()
            if r < 0.5:
                rid = rnd.choice(list(recent)) if recent else "nothing-yet"
                await ctl.sock.send_multipart(protocol.encode(protocol.Kind.CANCEL, protocol.CancelRequest(rid)))
                counts["cancels"] += 1
            elif r < 0.7:
                await ctl.sock.send_multipart(protocol.encode(protocol.Kind.STATUS, protocol.StatusRequest(f"c0-{rnd.randrange(400)}")))
            elif r < 0.8:
                await ctl.sock.send_multipart(protocol.encode(protocol.Kind.STATS, protocol.Empty()))
            else:
                await junk.sock.send_multipart([protocol.header(protocol.Kind.SUBMIT), os.urandom(rnd.randrange(1, 200))])
                await junk.recv(10)
                counts["malformed"] += 1
                continue
            await ctl.recv(10)
    finally:
        ctl.close()
        junk.close()
        ctx.term()


def test_soak_rss_and_fds_stay_flat(services, reliability, rng_seed):
    s = reliability.scale
    sched = services.scheduler("--max-queued-groups", "16", metrics=True)
    for _ in range(2):
        services.worker(sched, capacity=8)
    sched.wait_workers(2)
    pid = sched.proc.pid
    ledger = Ledger()
    samples: list[tuple[float, int, int]] = []
    counts = {"cancels": 0, "malformed": 0}

    async def main():
        t0 = time.monotonic()
        stop_at = t0 + s.soak_s

        async def sampler():
            while time.monotonic() < stop_at + 0.5:
                samples.append((time.monotonic() - t0, proc_rss_kb(pid), proc_fds(pid)))
                await asyncio.sleep(0.25)  # a sampling period, not an ordering device

        task = asyncio.create_task(sampler())
        recent = collections.deque(maxlen=32)
        noise = asyncio.create_task(_noise(sched, stop_at, random.Random(rng_seed + 5), counts, recent))
        results = await _run_clients(sched.request, 8, 0, 3, rng_seed, ledger, handle=sched, duration_s=s.soak_s,
                                     churn_every=20, retry_overloaded=3, recent=recent)
        await noise
        await task
        return results

    results = asyncio.run(main())
    reconnects = sum(r["reconnects"] for r in results)
    warm = max(5.0, 0.25 * s.soak_s)
    base = [x for x in samples if x[0] <= warm]
    after = [x for x in samples if x[0] > warm]
    assert base and after, samples
    rss0, fd0 = base[-1][1], base[-1][2]
    rss_growth_mb = (max(x[1] for x in after) - rss0) / 1024
    fd_growth = max(x[2] for x in after) - fd0
    st = stats(sched)
    summary = ledger.summary()
    ok = rss_growth_mb < 20 and fd_growth < 10
    reliability.add("soak", f"{s.soak_s:.0f} s mixed load (8 clients, {reconnects} reconnects, {counts['cancels']} "
                    f"cancels, {counts['malformed']} malformed) on a metrics-enabled scheduler", summary["requests"],
                    f"RSS {rss0 / 1024:.1f} MB after {warm:.0f} s warm-up, growth {rss_growth_mb:+.1f} MB (< 20); "
                    f"fds {fd0}, growth {fd_growth:+d} (< 10); done {ledger.statuses['done']}, "
                    f"cancelled {ledger.statuses['cancelled']}, overloaded {ledger.statuses['overloaded']}, lost "
                    f"{summary['lost']}, duplicated {summary['duplicated']}", ok=ok)
    ledger.assert_clean(reliability)
    assert st["handler_errors"] == 0 and st["groups_in_flight"] == 0
    assert rss_growth_mb < 20, f"scheduler RSS grew {rss_growth_mb:.1f} MB after warm-up: {samples[::8]}"
    assert fd_growth < 10, f"scheduler fds grew by {fd_growth} after warm-up: {samples[::8]}"
