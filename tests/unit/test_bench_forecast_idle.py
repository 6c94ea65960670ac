"""The idle-forecast tool's tables (bench/forecast_idle.py): the fixed-cost replay and the noise floor."""

from __future__ import annotations

from candidate_scheduler.bench.forecast_idle import compare, elastic_table, noise_floor, replay_fixed


def group(phase: str, fresh: bool, count: int = 1, measured_s: float = 0.2) -> dict:
    return {"phase": phase, "label": "64x64", "count": count, "fresh": fresh,
            "fixed_s": 0.025 if fresh else 0.005, "measured_s": measured_s}


def row(table: str, phase: str) -> list[str]:
    [line] = [line for line in table.splitlines() if line.startswith(f"| {phase} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_replay_shows_what_knowing_fresh_from_cached_would_save():
    groups = [group("p (caching)", True), group("p (caching)", False)]
    groups += [group("p", fresh) for fresh in (True, False) * 6]
    _phase, n, _median, cost_model_ms, told_ms = row(replay_fixed(groups), "p")
    assert n == "12" and float(told_ms) == 0.0 < float(cost_model_ms)  # one mean sits between the two kinds


def test_the_noise_floor_is_the_share_of_identical_work_within_10_percent_of_its_median():
    steady = [group("p", True, count=8, measured_s=0.2) for _ in range(4)]
    noisy = [group("q", True, count=8, measured_s=t) for t in (0.2, 0.2, 0.3, 0.1)]
    table = noise_floor(steady + noisy)
    assert row(table, "p")[-1] == "100%" and row(table, "q")[-1] == "50%"


def test_compare_puts_each_run_in_its_own_column():
    run = {"tag": "a", "git": "x", "phases": [{"phase": "p", "ratios": [0.5, 1.0, 1.05, 2.0]}]}
    cells = row(compare([run, {**run, "tag": "b"}]), "p")
    assert cells[1] == "4" and cells[2] == cells[3] and cells[2].endswith("50%")


def test_the_elastic_row_counts_a_late_done_as_a_miss():
    def trial(status: str, elapsed_s: float, served: int | None = 10) -> dict:
        return {"status": status, "served": served, "elapsed_s": elapsed_s, "deadline_s": 1.5,
                "forecasts": [{"predicted_s": 1.0, "measured_s": elapsed_s}]}

    table = elastic_table([trial("done", 1.2), trial("done", 1.4), trial("done", 1.6), trial("expired", 1.5, None)])
    n, in_time, other, served, slack, worst = row(table, "4")
    assert (n, in_time, other, served) == ("4", "2", "expired", "10-10")
    assert slack == "100 / 200" and worst == "1.60"
    assert elastic_table([]) == ""
