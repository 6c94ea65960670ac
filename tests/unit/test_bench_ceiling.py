"""The method report's speedup ceiling: (a) over (c)'s own conditioning, from the run's own figures."""

from candidate_scheduler.bench.targets import speedup_ceiling


def _result(a_ms, cond_ms):
    methods = {"a_sequential": {"8": {"median_ms": a_ms}}, "c_worker_batch": {"8": {"condition_ms": cond_ms}}}
    return {"shapes": {"small": {"methods": methods}}}


def test_ceiling_is_a_over_the_conditioning_of_c():
    c = speedup_ceiling(_result(360.0, 90.0))
    assert c == {"a_ms": 360.0, "c_condition_ms": 90.0, "ceiling_x": 4.0}


def test_no_ceiling_without_the_figures():
    assert speedup_ceiling({"shapes": {}}) is None
    assert speedup_ceiling(_result(360.0, None)) is None
    assert speedup_ceiling(_result(360.0, 0.0)) is None
