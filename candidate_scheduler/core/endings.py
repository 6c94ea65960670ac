"""The end of a group: its one reply sent, and every trace of it in the engine's queues forgotten.

`Endings` holds no state of its own: it is the part of the engine (core/engine.py) that answers a group
and forgets it, kept in its own file as core/intake.py keeps the beginning. Whatever ends a group -- its
last result, a cancel, an expiry, a shutdown, a fault -- comes here, so "answered exactly once" has one
door: the reply is taken from GroupState, which hands it out once; resubmissions waiting on the group get
the same answer; the answer is kept for later resubmissions (core/resubmission.py). `leaves_queue` is
the queue's side of it (the fair-queue clock, the unstarted set), which a group's first start runs too.
"""

from __future__ import annotations

from candidate_scheduler.core.group import Group, refusal
from candidate_scheduler.core.group_state import INTERNAL_ERROR
from candidate_scheduler.core.messages import CancelRows, GroupResult, Reply
from candidate_scheduler.core.resubmission import array_bytes

REPLY_TOO_LARGE = "reply_too_large"  # a reply its client's link could not take: the group fails instead
REPLY_TOO_LARGE_HINT = "ask for fewer candidates, or for the reduced action only (return_candidates false)"


class Endings:
    def __init__(self, engine):
        self.engine = engine
        e = engine
        # Forgetting a group, step by step (each reads the engine's attributes when it runs). Every step runs
        # even if one before it raised: a step skipped left an ended group queued (every planning pass that
        # picked it raised again) or its tenant's count held for good.
        self._forget_steps = (
            lambda g: e.groups.get(g.request_id) is g and e.groups.pop(g.request_id),
            lambda g: e.waiting.pop(g.request_id, None),
            lambda g: e.pending.discard_group(g.request_id),
            lambda g: e.elastic.discard(g.request_id),
            lambda g: self.leaves_queue(g, started=False),
            lambda g: e.tenants.forgot(g.request_id, g.tenant),
            lambda g: e.held.pop(g.request_id, None),  # its workers were told to stop (end): answers match by batch id
        )

    def end(self, g: Group) -> None:
        """Send the group's one reply and forget it. Workers still running its slices are told to stop."""
        e = self.engine
        rid = g.request_id
        for batch_id in sorted(e.held.get(rid, ())):
            a = e.assignments.get(batch_id)
            worker = None if a is None else e.worker_of(a.worker_id)
            if worker is not None and rid not in a.cancelled:
                a.cancelled.add(rid)
                e.outbox.append(CancelRows(worker.identity, a.batch_id, (rid,)))
        reply = g.take_reply()
        result = None
        try:
            if reply is not None:
                try:
                    result = self._fitted(rid, g.result(reply))
                except Exception as exc:  # noqa: BLE001 - the reply could not be built: still one answer
                    e.report_fault("reply", exc, answered=(rid,))  # counted and logged as every fault
                    result = refusal(rid, "failed", INTERNAL_ERROR,
                                     f"the reply could not be built: {type(exc).__name__}: {exc}")
                e.outbox.append(Reply(g.client, result))
                e.outbox.extend(Reply(waiter, result) for waiter in g.waiters)  # resubmissions: the same answer
                e.replies.put(rid, e.tenants.owners_of(rid) or (), g.fingerprint, result)
        finally:
            # Once its reply is taken the group is forgotten whatever raised above: the guard that reports
            # the fault finds the reply taken and does nothing, so a group kept here stayed in flight for
            # good (counted against the limits, holding a graceful stop, parking resubmissions unanswered).
            self.forget(g)
            # STATUS must say what the reply said ("rejected" is a FAILED group to the state machine)
            e.finished[rid] = g.status.name.lower() if result is None else result.status
            e.finished.move_to_end(rid)  # an id used again ends newest: it is forgotten last, not first
            while len(e.finished) > e.config.finished_memory:
                e.finished.popitem(last=False)
            if result is not None:  # the reply went out: counted, even if keeping it raised after
                self._count(g, result)

    def _fitted(self, rid: str, result: GroupResult) -> GroupResult:
        """A reply its client's link could not take fails its group here, where the group is counted, kept
        for a resubmission and said by STATUS (when only the shell's check of the encoded bytes caught it,
        the client was told `reply_too_large` while the metrics and STATUS said done)."""
        limit = self.engine.reply_limit_bytes
        if limit is None:
            return result
        size = array_bytes(result)
        if size <= limit:
            return result
        return refusal(rid, "failed", REPLY_TOO_LARGE,
                       f"the reply's arrays are {size} bytes, over the {limit} a reply may carry: "
                       + REPLY_TOO_LARGE_HINT)

    def _count(self, g: Group, result) -> None:
        e = self.engine
        e.metrics.group_completed(result.status, e.now - g.received_at)
        e.metrics.tenant_group(g.tenant, result.status, g.served_count if result.status == "done" else 0)
        if result.status == "done":
            e.metrics.served(g.spec.count, g.served_count)
        if g.deadline is not None and result.status in ("done", "expired") and \
                (result.status == "expired" or e.now > g.deadline):
            e.metrics.deadline_miss()

    def forget(self, g: Group) -> None:
        """Every trace of the group gone from the engine's queues; if a step raised, the first fault is raised
        after all of them ran."""
        fault = None
        for step in self._forget_steps:
            try:
                step(g)
            except Exception as exc:  # noqa: BLE001 - raised on below, once the other steps have run
                fault = fault or exc
        if fault is not None:
            raise fault

    def leaves_queue(self, g: Group, started: bool) -> None:
        e = self.engine
        e.unstarted.discard(g.request_id)
        if g.fair_tag is not None:
            e.tenants.clock.left(g.fair_tag, started)
            g.fair_tag = None
