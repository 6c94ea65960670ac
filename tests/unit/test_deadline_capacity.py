"""The deadline benchmark's capacity bisection, and the smoke run's promise that its top load
overloads the worker whatever the two short probes saw (the elastic smoke test depends on it)."""

from __future__ import annotations

import itertools

import pytest

from candidate_scheduler.bench import deadline_settings
from candidate_scheduler.bench.deadline_capacity import search_capacity


def scripted(outcomes):
    """A probe that passes or misses as scripted, in order."""
    it = iter(outcomes)

    def probe(rate):
        ok = next(it)
        return {"groups": 10, "misses": 0 if ok else 1, "miss_rate": 0.0 if ok else 0.1,
                "refused": 0, "expired": 0, "done_late": 0 if ok else 1}
    return probe


@pytest.mark.parametrize("outcomes, capacity, found", [
    ((True, True), 0.75, True), ((True, False), 0.5, True),
    ((False, True), 0.25, True), ((False, False), 0.25, False),
])
def test_two_probes_bisect_from_half_of_mu(outcomes, capacity, found):
    got = search_capacity(scripted(outcomes), mu=1.0, iterations=2)
    assert got["capacity"] == pytest.approx(capacity) and got["found"] is found
    assert [p["rate"] for p in got["probes"]][0] == pytest.approx(0.5) and len(got["probes"]) == 2


def test_smoke_top_load_is_at_least_twice_mu_for_any_probe_outcome():
    settings = deadline_settings.smoke()
    mu = 10.0
    for outcomes in itertools.product((True, False), repeat=settings.capacity_iterations):
        cap = search_capacity(scripted(outcomes), mu, settings.capacity_iterations)["capacity"]
        assert max(settings.factors) * cap >= 2 * mu, (outcomes, cap)
