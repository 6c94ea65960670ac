"""Function calls of one in-process engine run, under cProfile (deterministic, unlike timings on a shared
host): `PYTHONPATH=TREE DL=0|1 MODE=dispatch|step python call_counts.py` prints the mode, whether every
group has a deadline, the calls in all, and the cost model's `_changed` calls. The fake workers' reports
carry a conditioning time, as a real worker's do (fleet_engine's carry none)."""

from __future__ import annotations

import cProfile
import os
import pstats

from candidate_scheduler.bench import fleet_engine
from candidate_scheduler.core.messages import WorkerResult
from candidate_scheduler.gc_tuning import tune_gc


def main() -> None:
    tune_gc()
    plain = fleet_engine.FakeFleet.result_of

    def result_of(self, send):
        r = plain(self, send)
        return WorkerResult(r.worker_id, r.batch_id, r.outputs, {**r.report, "condition_s": 0.002})

    fleet_engine.FakeFleet.result_of = result_of
    profile = cProfile.Profile()
    profile.enable()
    fleet_engine.time_per_event(os.environ["MODE"], 1000, events=1500, warmup=100,
                                deadline_every=int(os.environ.get("DL", "1")))
    profile.disable()
    stats = pstats.Stats(profile).stats
    calls = sum(counts[1] for counts in stats.values())
    changed = sum(counts[1] for (_file, _line, name), counts in stats.items() if name == "_changed")
    print(os.environ["MODE"], os.environ.get("DL"), calls, changed)


if __name__ == "__main__":
    main()
