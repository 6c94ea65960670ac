"""Two builds' fleet runs side by side (bench/fleet_compare.py)."""

from __future__ import annotations

from candidate_scheduler.bench.fleet_compare import compare
from candidate_scheduler.bench.fleet_report import cpu_us_per_group


def run(utilisation: float, scheduler_cores: float, *, wrong: int = 0, workers: int = 16) -> dict:
    return {"workers": workers, "batching": "dispatch", "workload": {"name": "burst"}, "utilisation": utilisation,
            "groups_per_s": 2000.0, "wall_s": 2.0, "cores": {"scheduler": scheduler_cores},
            "check": {"replies": 4000, "groups": 4000, "wrong_results": wrong}}


def result(git: str, *runs: dict) -> dict:
    return {"meta": {"git": git}, "fleet": {"runs": list(runs)}}


def test_the_scheduler_cpu_per_group_is_its_cores_over_the_groups_answered():
    assert cpu_us_per_group(run(0.7, 0.8), "scheduler") == 400.0  # 0.8 cores at 2,000 groups/s


def test_each_build_is_a_range_over_its_runs_and_a_wrong_reply_shows():
    table = compare([result("old", run(0.6, 0.8)), result("old", run(0.7, 0.9))],
                    [result("new", run(0.8, 0.6), run(0.9, 0.5, workers=32)), result("new", run(0.85, 0.6, wrong=1))])
    [line] = [line for line in table.splitlines() if line.startswith("| 16 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["0.60-0.70", "0.80-0.85", "400-450", "300", "NO"]
    assert "| 32 |" not in table  # only in one build: nothing to compare
    assert table.startswith("Before: old (2 runs); after: new (2 runs).")
