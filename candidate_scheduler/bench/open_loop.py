"""Open-loop arrivals: groups sent at precomputed Poisson times, never waiting for a reply before the
next send (a closed loop would slow its own arrivals down exactly when the service falls behind, and
hide the overload a deadline benchmark is about).

A schedule is a list of send times (seconds from the window's start). `poisson_schedule` offers exactly
its nominal load over the window. `unit_schedule` draws the gaps of a rate-1 Poisson process once;
`at_rate` scales it, so probes at different rates see the same arrival pattern, only faster or slower
(the miss count is then nearly monotone in the rate, which a bounded search needs). `run_open_loop` sends every request at its time on one asyncio DEALER connection and
collects one `Outcome` per request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from candidate_scheduler.service.async_client import AsyncClient
from candidate_scheduler.service.client import ServiceError

# reply metrics kept per outcome (the rest of the reply's metrics are not needed by the summaries)
KEPT_METRICS = ("total_s", "queue_wait_s", "first_step_s", "served_count", "requested_count", "joined_running_batches",
                "receipt_to_reply_s")


@dataclass
class Outcome:
    """One request's fate as the client saw it."""

    index: int
    seed: int
    scheduled_s: float  # its time in the schedule (from the window's start)
    lag_s: float  # how late the client sent it (event-loop delay)
    latency_s: float | None  # client send -> reply received; None: no reply before the drain ended
    status: str  # the reply's status, or "no_reply"
    error_code: str | None = None
    served_count: int | None = None
    metrics: dict = field(default_factory=dict)
    candidate_seeds: tuple[int, ...] = ()
    candidates: np.ndarray | None = None  # [served, horizon, D] when the request asked for them
    action: np.ndarray | None = None


def unit_schedule(n: int, seed: int) -> np.ndarray:
    """Arrival times of a rate-1 Poisson process: the first n cumulative exponential gaps."""
    gaps = np.random.default_rng(seed).exponential(1.0, size=n)
    return np.cumsum(gaps)


def at_rate(unit: np.ndarray, rate: float, window_s: float) -> list[float]:
    """The unit schedule at `rate` arrivals per second, cut at the window's end."""
    times = unit / float(rate)
    kept = times[times < window_s]
    if kept.size == len(unit):
        raise ValueError(f"the unit schedule ({len(unit)} arrivals) is too short for {rate}/s over {window_s} s")
    return [float(t) for t in kept]


def poisson_schedule(rate: float, window_s: float, seed: int) -> list[float]:
    """Send times of a Poisson process at `rate` per second over `window_s` seconds, conditioned on its
    expected count: round(rate * window_s) times, uniform and independent over the window, sorted (what
    a Poisson process is, given its count). A short window then offers exactly the load it is labelled
    with, instead of a draw that may be 30% over or under it."""
    n = max(1, round(rate * window_s))
    return sorted(float(t) for t in np.random.default_rng(seed).uniform(0.0, window_s, size=n))


async def _run(endpoint: str, requests: list, seeds: list[int], times: list[float], drain_s: float,
               on_reply=None, ping_s: float | None = None) -> tuple[list[Outcome], list[float]]:
    client = AsyncClient(endpoint, liveness_s=None)  # measured: its own timeouts, no liveness PINGs
    loop = asyncio.get_running_loop()
    outcomes: list[Outcome | None] = [None] * len(requests)
    tasks = []
    pings: list[float] = []
    sending = True

    async def pinger() -> None:
        # PING is answered by the scheduler's IO loop itself, without the engine: its round trip is the
        # baseline (sockets, both event loops, the machine) a refusal's round trip is read against
        while sending:
            t = time.perf_counter()
            if await client.ping(timeout_s=2.0):
                pings.append(time.perf_counter() - t)
            await asyncio.sleep(ping_s)

    async def one(i: int, lag: float) -> None:
        sent = time.perf_counter()
        try:
            r = await client.submit_request(requests[i])
        except ServiceError as exc:
            outcomes[i] = Outcome(i, seeds[i], times[i], lag, time.perf_counter() - sent, "error",
                                  exc.reply.error_code)
            return
        latency = time.perf_counter() - sent
        outcomes[i] = Outcome(i, seeds[i], times[i], lag, latency, r.status, r.error_code, r.served_count,
                              {k: r.metrics[k] for k in KEPT_METRICS if k in r.metrics}, tuple(r.candidate_seeds),
                              r.candidates, r.action)
        if on_reply is not None:
            on_reply(outcomes[i])

    try:
        # one ping first: the connection is up before the clock starts, so the first send is not slow
        await client.ping(timeout_s=10.0)
        ping_task = loop.create_task(pinger()) if ping_s else None
        start = loop.time()
        for i, t in enumerate(times):
            delay = start + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(one(i, max(0.0, loop.time() - start - t))))
        sending = False
        if ping_task is not None:
            await ping_task
        if tasks:
            await asyncio.wait(tasks, timeout=drain_s)
    finally:
        for task in tasks:
            task.cancel()
        client.close()
    return [o if o is not None else Outcome(i, seeds[i], times[i], 0.0, None, "no_reply")
            for i, o in enumerate(outcomes)], pings


def run_open_loop(endpoint: str, requests: list, seeds: list[int], times: list[float], drain_s: float,
                  on_reply=None, ping_s: float | None = None) -> tuple[list[Outcome], list[float]]:
    """Send requests[i] at times[i] (seconds from now); wait at most `drain_s` after the last send for
    the replies still missing (those are "no_reply"). `on_reply(outcome)` is called as each arrives.
    With `ping_s`, a PING every ping_s seconds while sending. Returns (outcomes, ping round trips)."""
    if not len(requests) == len(seeds) == len(times):
        raise ValueError("requests, seeds and times must have the same length")
    return asyncio.run(_run(endpoint, requests, seeds, times, drain_s, on_reply, ping_s))
