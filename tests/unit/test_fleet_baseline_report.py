"""The before/after report of the engine in process (bench/fleet_report.write_baseline)."""

from __future__ import annotations

from candidate_scheduler.bench.fleet_report import write_baseline


def _row(revision: str, mode: str, depth: int, event_ms: float, deadline_every: int = 0) -> dict:
    return {"revision": revision, "batching": mode, "depth": depth, "events": 300, "workers": 32, "rows": 8,
            "deadline_every": deadline_every, "event_ms": {"median": event_ms}, "event_mean_ms": event_ms,
            "submit_us": 50.0, "groups_per_s": 8 / (event_ms / 1e3)}


def test_the_report_puts_each_engine_beside_the_other_with_and_without_deadlines_and_elastic(tmp_path):
    meta = {"created": "now", "git": "new", "baseline": "old", "cpu_count": 2, "loadavg_start": [0], "loadavg_end": [0],
            "wall_s": 1.0, "engine_workers": 32, "engine_rows": 8, "same_events": True}
    plain = [_row(rev, "dispatch", d, ms) for d in (100, 10_000) for rev, ms in (("baseline", 1.0), ("current", 0.5))]
    deadline = [_row(rev, "dispatch", d, ms, 1) for d in (100, 10_000) for rev, ms in (("baseline", 2.0), ("current", 0.8))]
    elastic = [_row(rev, "step", 1000, ms, 1) for rev, ms in (("baseline", 3000.0), ("current", 3.0))]
    files = write_baseline({"meta": meta, "engine": plain, "engine_deadlines": deadline, "engine_elastic": elastic},
                           tmp_path, plot=False)
    text = (tmp_path / "fleet_baseline.md").read_text()
    assert files["report"].endswith("fleet_baseline.md")
    assert "#### Without deadlines" in text and "#### Every group with a deadline" in text
    with_deadlines = text.split("#### Every group with a deadline")[1]
    assert "| before (old) | dispatch | 10,000 | 300 | 2.000 |" in with_deadlines
    assert "| this revision | dispatch | 10,000 | 300 | 0.800 |" in with_deadlines
    assert "Fewer events" not in text  # both engines ran the same events
    elastic_part = text.split("#### Every group elastic")[1]
    assert "| before (old) | step | 1,000 | 300 | 3000.000 |" in elastic_part
    assert "| this revision | step | 1,000 | 300 | 3.000 |" in elastic_part
