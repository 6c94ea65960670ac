"""Every answer the engine sends is counted once in groups_completed_total and once, under the sender's
tenant, in tenant_groups_total: the two add up to the same total (docs/metrics.md: "Groups answered ...
refusals included"), whatever path the answer took -- the engine's last-resort answers to its own faults
too, which an operator most needs to see."""

from __future__ import annotations

from tests.unit.test_engine import Harness
from tests.unit.test_metrics_engine_counts import P, _value, _with_metrics


def _total(registry, name) -> float:
    return sum(s.value for f in registry.collect() for s in f.samples if s.name == P + name)


def test_a_group_answered_by_the_last_resort_of_a_fault_is_counted_as_completed(monkeypatch):
    """A fault in an event fails its group; when failing it raises too, the engine answers it plainly (its
    last resort). That answer was sent but never counted: groups_completed_total stayed short of the
    answers, and the group's latency and tenant went unrecorded."""
    from candidate_scheduler.core.group import Group

    h = Harness()
    registry = _with_metrics(h)
    h.register("w1")
    h.submit("g", count=2)

    def broken(self, *args, **kwargs):
        raise RuntimeError("broken state")

    monkeypatch.setattr(Group, "fold", broken)  # the result's event raises: its group is failed ...
    monkeypatch.setattr(Group, "fail", broken)  # ... and failing it raises too: the last resort answers
    h.advance(0.5)
    h.answer(h.work[0])
    r = h.reply("g")
    assert (r.status, r.error_code) == ("failed", "internal_error")
    assert _value(registry, "groups_completed_total", outcome="failed") == 1
    assert _value(registry, "group_latency_seconds_count", outcome="failed") == 1
    assert _value(registry, "group_latency_seconds_sum", outcome="failed") == 0.5
    assert _value(registry, "tenant_groups_total", tenant="default", outcome="failed") == 1


def test_a_submission_answered_by_the_last_resort_refusal_is_counted_for_its_tenant(monkeypatch):
    """A submit that raises before its group is kept is answered failed/internal_error and counted in
    groups_completed_total, but it was missing from tenant_groups_total: the per-tenant answers no longer
    added up to the answers."""
    from candidate_scheduler.core import intake

    h = Harness()
    registry = _with_metrics(h)
    h.register("w1")

    def broken(sub):
        raise RuntimeError("validation fell over")

    monkeypatch.setattr(intake, "validate", broken)
    h.submit("g", count=2)
    assert h.reply("g").error_code == "internal_error"
    assert _value(registry, "groups_completed_total", outcome="failed") == 1
    assert _value(registry, "tenant_groups_total", tenant="default", outcome="failed") == 1
    assert _total(registry, "tenant_groups_total") == _total(registry, "groups_completed_total")


def test_a_group_answered_before_a_fault_in_its_ending_is_counted_once(monkeypatch):
    """Ending a group sends its reply, then keeps it for resubmissions. A fault after the reply went out (in
    keeping it) forgot the group -- answered, once -- but skipped its count: groups_completed_total fell
    one short of the answers for good (and with it received - resubmissions - completed, the groups in
    flight by docs/metrics.md)."""
    h = Harness()
    registry = _with_metrics(h)
    h.register("w1")
    h.submit("g", count=2)

    def broken(*args, **kwargs):
        raise RuntimeError("cannot keep the reply")

    monkeypatch.setattr(h.engine.replies, "put", broken)
    h.answer(h.work[0])
    assert h.reply("g").status == "done"  # answered once, as computed
    assert _value(registry, "internal_errors_total", kind="result") == 1
    assert _value(registry, "groups_completed_total", outcome="done") == 1
    assert _value(registry, "tenant_groups_total", tenant="default", outcome="done") == 1
    assert not h.engine.groups
    in_flight = (_total(registry, "groups_received_total") - _total(registry, "resubmissions_total")
                 - _total(registry, "groups_completed_total"))
    assert in_flight == len(h.engine.groups) == 0
