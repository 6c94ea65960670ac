"""The before/after report of the engine in process (bench/fleet_report.write_baseline)."""

from __future__ import annotations

from candidate_scheduler.bench.fleet_report import write_baseline


def _row(revision: str, mode: str, depth: int, event_ms: float, deadline_every: int = 0, workers: int = 32,
         submit_us: float = 50.0) -> dict:
    return {"revision": revision, "batching": mode, "depth": depth, "events": 300, "workers": workers, "rows": 8,
            "deadline_every": deadline_every, "event_ms": {"median": event_ms}, "event_mean_ms": event_ms,
            "submit_us": submit_us, "groups_per_s": 8 / (event_ms / 1e3)}


def test_the_report_puts_each_engine_beside_the_other_with_and_without_deadlines_and_elastic(tmp_path):
    """Every series, the fleet sizes under the defaults on a simulated clock too, with its ratios."""
    meta = {"created": "now", "git": "new", "baseline": "old", "cpu_count": 2, "loadavg_start": [0], "loadavg_end": [0],
            "wall_s": 1.0, "engine_workers": 32, "engine_rows": 8, "same_events": True}
    plain = [_row(rev, "dispatch", d, ms) for d in (100, 10_000) for rev, ms in (("baseline", 1.0), ("current", 0.5))]
    deadline = [_row(rev, "dispatch", d, ms, 1) for d in (100, 10_000) for rev, ms in (("baseline", 2.0), ("current", 0.8))]
    elastic = [_row(rev, "step", 1000, ms, 1) for rev, ms in (("baseline", 3000.0), ("current", 3.0))]
    sizes = [_row(rev, "dispatch", 1000, 1.0, 1, k, us) for k, old, new in ((32, 100.0, 90.0), (512, 400.0, 180.0))
             for rev, us in (("baseline", old), ("current", new))]
    defaults = [{"revision": rev, "batching": "dispatch", "workers": k, "engine_us_per_group": us, "submit_us": us / 2,
                 "result_us": {"median": 4 * us, "max": 8 * us}, "wake_us": {"median": us, "max": 50 * us if k > 32 else None},
                 "wakes_per_result": 1.0,
                 "staggered_starts": k - 1, "utilisation": 0.99,
                 **({"charged": True, "answered_over_ideal": 0.975, "loop_busy": 0.3} if rev == "current" else {})}
                for k, old, new in ((32, 300.0, 200.0), (512, 2400.0, 240.0)) for rev, us in (("baseline", old), ("current", new))]
    files = write_baseline({"meta": meta, "engine": plain, "engine_deadlines": deadline, "engine_elastic": elastic,
                            "engine_sizes": sizes, "engine_defaults": defaults}, tmp_path, plot=True)
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
    by_size = text.split("#### Against the fleet's size")[1]
    assert "| before (old) | dispatch | 512 | 300 | 1.000 | 400 |" in by_size
    assert "| this revision | dispatch | 512 | 300 | 1.000 | 180 |" in by_size
    assert "this revision, dispatch: at 512 workers a submission costs 2.00x and an event 1.00x" in by_size
    assert "before (old), dispatch: at 512 workers a submission costs 4.00x" in by_size
    under_defaults = text.split("under the scheduler's defaults")[1]
    # the longest event: a wake-up at 512 workers, a result at 32 (no wake-up there)
    # charged to the clock (the new engine's rows): what it kept of the ideal, and how busy its loop was
    assert "| before (old) | dispatch | 512 | 2400 | 1200 | 9600 | 2400 | 120.0 | 1.00 | 511 | 0.99 | - | - |" \
        in under_defaults
    assert "| this revision | dispatch | 512 | 240 | 120 | 960 | 240 | 12.0 | 1.00 | 511 | 0.99 | 0.975 | 0.300 |" \
        in under_defaults
    assert "| this revision | dispatch | 32 | 200 | 100 | 800 | 200 | 1.6 | 1.00 | 31 | 0.99 | 0.975 | 0.300 |" \
        in under_defaults
    assert "The engine's time was charged to the simulated clock" in under_defaults
    assert "this revision, dispatch: at 512 workers a group costs 1.20x and a submission 1.20x" in under_defaults
    assert "before (old), dispatch: at 512 workers a group costs 8.00x" in under_defaults
    assert files["plots"] == ["fleet_baseline.png", "fleet_baseline_sizes.png", "fleet_baseline_defaults.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in files["plots"])
