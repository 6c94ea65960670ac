"""`bench/saturation.py` keeps working: both arms as real processes (null workers here, so it is quick),
alternating rounds, every reply `done` (the drain raises otherwise), and a report with both arms' rates
and the ratio per round. Numbers are not asserted."""

from __future__ import annotations

import pytest

from candidate_scheduler.bench import saturation


@pytest.mark.timeout(240)
def test_both_arms_drain_their_rounds_and_the_report_gives_the_ratios():
    seen = []
    result = saturation.run(64, adapter="null", capacity=8, steps=4, inflight=4, groups=8, rounds=2,
                            progress=lambda mode, r, rate: seen.append((r, mode)))
    assert seen == [(0, "dispatch"), (0, "step"), (1, "step"), (1, "dispatch")]  # who goes first alternates
    rates = result["groups_per_s"]
    assert len(rates["dispatch"]) == len(rates["step"]) == 2 and min(rates["dispatch"] + rates["step"]) > 0
    assert result["step_over_dispatch"] == pytest.approx([s / d for s, d in zip(rates["step"], rates["dispatch"])])
    text = saturation.report([result])
    assert "| 64x64 |" in text and f"{result['step_over_dispatch'][0]:.2f}" in text
