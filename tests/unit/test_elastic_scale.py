"""The deadline rules' work per event does not grow with the elastic groups queued: counted, not timed.

With a burst of elastic groups each refusal at receipt and each probe of an elastic count once looked at
every elastic group queued (seconds per event at 1,000 of them). Here the groups the rules look at --
the views the engine builds for them -- are counted over the same events at two queue depths: a rule
that walks the queue again would show a count that grows with it."""

from __future__ import annotations

from candidate_scheduler.bench.fleet_engine import FakeFleet


def _views_per_event(depth: int, batching: str, events: int = 30) -> tuple[float, float]:
    """(group views built per worker-result event, per submission) with `depth` elastic groups queued."""
    fleet = FakeFleet(batching, 32, 8, deadline_every=1, counts=(8,), min_count=2)
    engine = fleet.engine
    fleet.submit(32 * (1 + engine.config.prefetch) + depth)  # the workers' rows full, `depth` groups waiting
    built = 0
    view_of = engine._group_view

    def counted(rid):
        nonlocal built
        built += 1
        return view_of(rid)

    engine._group_view = counted
    for _ in range(5):  # settle: the first passes size the head
        fleet.answer_oldest()
    event_views = submit_views = submitted = 0
    for _ in range(events):
        before = fleet.answered
        built = 0
        fleet.answer_oldest()
        event_views += built
        built = 0
        fleet.submit(fleet.answered - before)
        submit_views += built
        submitted += fleet.answered - before
    assert engine.queued_groups() >= depth * 0.9  # the depth held
    return event_views / events, submit_views / max(1, submitted)


def test_the_views_an_elastic_burst_costs_per_event_do_not_grow_with_the_queue():
    for batching in ("dispatch", "step"):
        shallow_event, shallow_submit = _views_per_event(100, batching)
        deep_event, deep_submit = _views_per_event(2000, batching)
        assert shallow_event > 0  # the rules ran (a submission builds none: the index answers for the queue)
        assert deep_event <= 1.5 * shallow_event + 20, (batching, shallow_event, deep_event)
        assert deep_submit <= 1.5 * shallow_submit + 20, (batching, shallow_submit, deep_submit)
