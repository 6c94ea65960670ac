"""The engine's intake: a submission checked, refused or kept, then admitted or refused at receipt.

`Intake` holds no state of its own: it is the part of the engine (core/engine.py) that takes new
groups, kept in its own file as core/control.py and core/worker_link.py keep theirs. A resubmission of
a group in flight or recently answered is answered once with that group's answer (core/resubmission.py).
The refusals come in a fixed order -- an unreadable id, another's id in flight, stopping or draining, the
scheduler's and then the tenant's limit on groups in flight, an invalid request -- and each is one typed
reply; nothing is kept before they pass.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from candidate_scheduler.core import deadlines
from candidate_scheduler.core.access import Principal
from candidate_scheduler.core.errors import CandidateContractError
from candidate_scheduler.core.group import Group
from candidate_scheduler.core.messages import Reply
from candidate_scheduler.core.request import Submission, check_request_id, validate
from candidate_scheduler.core.resubmission import MAX_WAITERS, same_request

# A group answered before its deadline leaves its entry in the deadline heap until the deadline passes (up
# to MAX_DEADLINE_S, an hour): past twice the groups in flight plus this many, those entries are dropped.
_EXPIRIES_SLACK = 256


def _trim_expiries(e) -> None:
    """Keep the deadline heap's entries of groups in flight only (amortized O(1) a push: after a trim the
    heap holds at most one entry per group, and the next trim waits for as many pushes again)."""
    live = [x for x in e.expiries if (g := e.groups.get(x[2])) is not None and g.serial == x[1]]
    heapq.heapify(live)
    e.expiries = live


class Intake:
    def __init__(self, engine):
        self.engine = engine

    def submit(self, client: Any, sub: Submission, principal: Principal, owners: tuple[str, ...],
               stored: list, fingerprint: bytes | None = None) -> None:
        e = self.engine
        e.metrics.group_received(sub.api)
        rid, tenant = sub.request_id, principal.tenant

        def refuse(status: str, code: str, message: str, field: str | None = None) -> None:
            e.outbox.extend(e.refuse(client, rid, status, code, message, field, tenant))

        try:
            check_request_id(rid)  # the client's own: its limit does not depend on its principal's name
        except CandidateContractError as exc:
            return refuse("invalid", exc.code, exc.detail, "request_id")
        rid = sub.scoped_id
        e.scoped_ids = e.scoped_ids or sub.scope is not None
        if rid in e.groups:  # core/resubmission.py: its owner waits for its one answer; anyone else is refused
            g = e.groups[rid]
            if principal.name in (e.tenants.owners_of(rid) or ()) and same_request(g.fingerprint, fingerprint):
                # One answer per destination: a client resending on the connection it sent from (after a drop it
                # could not tell apart from a lost reply, or in a loop) must not pile up copies of the reply.
                if client != g.client and client not in g.waiters:
                    g.waiters.append(client)
                    del g.waiters[:-MAX_WAITERS]
                e.metrics.resubmission("in_flight")
                return None
            return refuse("invalid", "duplicate_request_id", f"request {sub.request_id!r} is already in flight",
                          "request_id")
        kept = e.replies.get(rid, principal.name)
        if kept is not None:
            if not same_request(kept[0], fingerprint):
                return refuse("invalid", "duplicate_request_id",
                              f"request id {sub.request_id!r} was used for a different request; use a new id",
                              "request_id")
            e.outbox.append(Reply(client, kept[1]))
            e.metrics.resubmission("answered")
            return None
        if e.draining:
            if e.stopping:  # a client that resubmits sends it to the next run (service/client.py)
                return refuse("rejected", "stopping", "the scheduler is stopping and admits no new groups; send "
                                                      "it again once it is back")
            # an operator's drain: nothing says it comes back
            return refuse("rejected", "draining", "the scheduler is draining and admits no new groups")
        if e.tenants.over_capacity(tenant, len(e.groups), e.config.max_queued_groups):
            return refuse("overloaded", "overloaded", f"{len(e.groups)} groups in flight; try again later")
        over = e.tenants.over_limit(principal)
        if over is not None:
            return refuse("overloaded", "tenant_overloaded", over)
        try:
            request = validate(sub)
            # derives the seeds: a bad base seed raises here
            group = Group(request, client, e.now, e.clock, e.stopwatch)
        except CandidateContractError as exc:
            return refuse("invalid", exc.code, str(exc), exc.field)
        except (ValueError, TypeError) as exc:
            return refuse("invalid", getattr(exc, "kind", "bad_request"), str(exc))
        group.tenant = tenant
        group.fingerprint = fingerprint
        e.groups[rid] = group
        stored.append(group)  # at once: kept and not in `stored`, a fault left it in flight and unanswered
        e.tenants.kept(rid, tenant, owners)
        e.serial += 1
        group.serial = e.serial
        e.metrics.candidates_per_group(request.spec.count)
        if group.deadline is not None:
            heapq.heappush(e.expiries, (group.deadline, group.serial, rid))
            if len(e.expiries) > 2 * len(e.groups) + _EXPIRIES_SLACK:
                _trim_expiries(e)
        if not e.workers:
            e.waiting[rid] = None  # admitted as soon as a worker registers
            return None
        refusal = None if group.deadline is None else deadlines.refuse_at_receipt(
            e.snapshot(e.now), e.group_view(group, order=e.order_of(group)))
        if refusal is not None:
            e.metrics.deadline_refusal()
            predicted = refusal.predicted
            when = f"in {predicted - e.now:.3f} s" if math.isfinite(predicted) else "after the deadline"
            if refusal.harmed:
                why = (f"it could finish {when}, within its deadline of {request.deadline_s:.3f} s, only by making "
                       f"{refusal.harmed} group(s) admitted before it miss theirs")
            else:
                why = (f"predicted completion {when} (at {request.spec.min_count} candidates) "
                       f"misses the deadline of {request.deadline_s:.3f} s")
            group.fail("deadline_unmeetable", why, field="deadline_s")
            e.end(group)
            return None
        e.admit(group)
        return None
