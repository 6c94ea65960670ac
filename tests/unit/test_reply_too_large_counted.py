"""A reply its client's link cannot take fails its group in the engine (core/endings.py), where the group
is counted, kept for a resubmission and said by STATUS. Before, the shell swapped it for `failed` /
`reply_too_large` on its way out, after the engine had counted it `done`: the metrics and STATUS said
done while the client was told failed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.resubmission import array_bytes
from candidate_scheduler.service.metrics import SchedulerMetrics
from tests.unit.test_engine import Harness, submission
from tests.unit.test_metrics import value


def test_a_reply_over_the_links_limit_is_a_failure_counted_kept_and_said_by_status():
    registry = CollectorRegistry()
    h = Harness()
    h.engine = Engine(EngineConfig(prefetch=0), SchedulerMetrics(registry), reply_limit_bytes=2_000)
    h.register("w1")
    h.submit("small", count=1)
    h.submit("big", count=8)  # eight candidates' actions, and the reduced one
    h.run_all()
    small, big = h.reply("small"), h.reply("big")
    assert small.status == "done" and array_bytes(small) <= 2_000
    assert (big.status, big.error_code) == ("failed", "reply_too_large") and "fewer candidates" in big.error
    assert value(registry, "groups_completed_total", outcome="done") == 1
    assert value(registry, "groups_completed_total", outcome="failed") == 1
    assert value(registry, "tenant_groups_total", tenant="default", outcome="failed") == 1
    assert h.engine.status("big").state == "failed"
    # its owner sending it again is answered from the kept reply, the same failure, not run again
    h.take(h.engine.submit(("client", "big-again"), submission("big", count=8), h.now))
    [again] = h.replies["big"][1:]
    assert again.error_code == "reply_too_large" and len(h.work) == 2
