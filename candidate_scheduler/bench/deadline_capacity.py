"""The fixed arm's capacity: the highest open-loop Poisson rate (groups/s) at which at most 1% of its
groups miss their deadlines, found by a short bisection.

The bracket is [0, mu], mu = 1 / (unloaded latency of a count-8 group): a count-8 group fills the
worker's 8 rows, so the fixed arm can never serve more than mu groups per second, and at mu a queue
(hence misses) is certain. Each probe replays one rate-1 arrival pattern scaled to the probed rate
(open_loop.at_rate), so a faster probe sees the same pattern compressed and the miss rate is nearly
monotone in the rate. The probes are short: with ~10-20 groups each, "<= 1%" means "no miss at all",
and the capacity is resolved to mu / 2^iterations. The report says so.
"""

from __future__ import annotations

from collections.abc import Callable

MAX_MISS_RATE = 0.01


def search_capacity(probe: Callable[[float], dict], mu: float, iterations: int,
                    max_miss_rate: float = MAX_MISS_RATE) -> dict:
    """probe(rate) -> a window summary (deadline_outcomes.summarize). Returns the capacity, every
    probe, and whether any probed rate passed (if none did, the lowest probed rate is reported as an
    upper bound and `found` is False)."""
    lo, hi = 0.0, float(mu)
    probes = []
    for _ in range(iterations):
        rate = (lo + hi) / 2.0
        s = probe(rate)
        ok = s["groups"] > 0 and s["miss_rate"] is not None and s["miss_rate"] <= max_miss_rate
        probes.append({"rate": rate, "fraction_of_mu": rate / mu, "ok": ok, "groups": s["groups"],
                       "misses": s["misses"], "miss_rate": s["miss_rate"], "refused": s["refused"],
                       "expired": s["expired"], "done_late": s["done_late"]})
        if ok:
            lo = rate
        else:
            hi = rate
    found = lo > 0
    return {"capacity": lo if found else hi, "found": found, "mu": mu, "resolution": mu / 2 ** iterations,
            "max_miss_rate": max_miss_rate, "probes": probes}
