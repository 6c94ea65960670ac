"""The engine's answers to the control socket: cancel, status, drain, shutdown, stats.

`Control` holds no state of its own: it is the part of the engine (core/engine.py) that answers control
requests, kept in its own file as core/worker_link.py keeps the worker link's. Cancel and shutdown run
inside the engine's atomic events; the rest only read.

Cancel follows vLLM v1's two-pass `finish_requests`: it says what it changed, and in which state it
found the group; cancelling a group that already ended changes nothing and says so.
"""

from __future__ import annotations

import math

from candidate_scheduler.core.access import FORBIDDEN, Action, Principal, denied
from candidate_scheduler.core.messages import LEAVE, REREGISTER, ControlAnswer, StopWorker


class Control:
    def __init__(self, engine):
        self.engine = engine

    def forbidden(self, principal: Principal, action: Action, request_id: str | None = None) -> ControlAnswer | None:
        """The refusal when `principal` may not do `action` (to this group); None when it may."""
        owners = None if request_id is None else self.engine.tenants.owners_of(request_id)
        why = denied(principal, action, owners)
        if why is None:
            return None
        self.engine.metrics.forbidden(action.value)
        return ControlAnswer(ok=False, error=why, error_code=FORBIDDEN)

    def cancel(self, request_id: str, answer: list) -> None:
        e = self.engine
        g = e.groups.get(request_id)
        if g is None:
            state = e.finished.get(request_id, "unknown")
            e.metrics.cancellation("done" if state != "unknown" else "unknown")
            answer.append(ControlAnswer(ok=True, changed=False, state=state))
            return
        hit = g.status.name.lower()
        with e.guard("cancel", request_id):
            changed = g.cancel()
            if changed:
                e.metrics.cancellation(hit)
                e.end(g)
        answer.append(ControlAnswer(ok=True, changed=changed, state=hit))

    def shutdown(self) -> None:
        """Every group in flight answered `shutting_down`; a leaving worker told to go (best effort: the
        worker link closes right after, and one that misses it goes at its grace). The other workers
        are told nothing: their heartbeats find the next run on the same address, which asks them to
        register (its answer to a heartbeat from a worker it does not know). Told to register again here,
        they sent their REGISTER to this run as it closed, lost, and tried again only after their
        register timeout (2 s): the next run had no workers that long (bench/scheduler_stop.py)."""
        e = self.engine
        e.draining = True
        for g in list(e.groups.values()):
            with e.guard("shutdown", g.request_id):
                g.fail("shutting_down", "the scheduler is shutting down")
                e.end(g)
        # a leaving worker told to register again goes at once: what it held was answered above
        e.outbox.extend(StopWorker(w.identity, REREGISTER) for w in e.leaving.values())

    def status(self, request_id: str) -> ControlAnswer:
        e = self.engine
        g = e.groups.get(request_id)
        if g is None:
            return ControlAnswer(ok=True, state=e.finished.get(request_id, "unknown"))
        return ControlAnswer(ok=True, state=g.status.name.lower(), detail={
            "count": g.spec.count,
            "slices": len(g.slices),
            "pending_slices": len(g.pending_slices()),
            "running_slices": len(g.running_slices()),
            "candidates_done": len(g.partial.done()),
        })

    def worker_leave(self, worker_id: str, answer: list) -> None:
        """Out of the fleet now; the worker is told to leave, says LEAVING and is answered as on SIGTERM."""
        e = self.engine
        worker = e.worker_of(worker_id)
        if worker is None:
            answer.append(ControlAnswer(ok=False, error=f"no worker {worker_id!r} is registered",
                                        error_code="unknown_worker"))
            return
        changed = e.link.out_of_fleet(worker)
        if changed:
            e.outbox.append(StopWorker(worker.identity, LEAVE))
        answer.append(ControlAnswer(ok=True, changed=changed, state="leaving",
                                    detail={"assignments": len(worker.assignments)}))

    def drain(self) -> ControlAnswer:
        e = self.engine
        changed = not e.draining
        e.draining = True
        return ControlAnswer(ok=True, changed=changed, state="draining", detail={"in_flight": len(e.groups)})

    def stats(self) -> dict:
        e = self.engine
        return {
            "groups_in_flight": len(e.groups),
            "queued_groups": e.queued_groups(),
            "queued_candidates": e.queued_candidates(),
            "batching": e.config.batching,
            # batches' worth a worker may hold, sent this long before it needs them (None: at once)
            "prefetch": {"batches": e.config.prefetch,
                         "lead_s": None if e.config.prefetch_lead_s == math.inf else e.config.prefetch_lead_s},
            "workers": {
                w.worker_id: {"capacity": w.capacity, "device": w.device, "busy": not w.idle, "step": w.step,
                              "rows_in_use": w.rows_in_use, "assignments": len(w.assignments),
                              # the extra lead late prefetch has learned this worker needs (core/prefetch.py)
                              "prefetch_margin_s": e.prefetch_margin.get(w.worker_id, 0.0),
                              # what deadline forecasts multiply its durations by (core/margins.py)
                              "forecast_margin": e.cost.margin(w.worker_id),
                              # forward shapes one candidate of which ran it out of memory (core/fleet_rows.py)
                              "refuses": sorted(w.refused_labels)}
                for w in e.workers.values()
            },
            # going: no new work, finishing what they hold (core/worker_link.py, "Leaving")
            "leaving": {w.worker_id: {"assignments": len(w.assignments)} for w in e.leaving.values()},
            # what the model can do (the first live worker's; a fleet serves one model), for fronts' metadata
            "capability": next(iter(e.workers.values())).capability.to_dict() if e.workers else None,
            "batches_in_flight": len(e.assignments),
            "draining": e.draining,
            "stopping": e.stopping,
            "tenants": {t: {"in_flight": n, "limit": e.tenants.policy(t).max_in_flight}
                        for t, n in sorted(e.tenants.in_flight.items())},
            "fair_queueing": e.tenants.clock.fair,
            "stagger": {"enabled": e.config.stagger, "starts": e.counters["staggered_starts"]},
            # the fleet's margin, over every worker's errors: what a worker with too few of its own plans
            # with (each worker's own is under "workers"; core/margins.py)
            "forecast_margin": e.cost.margin(),
            "late_results_discarded": e.counters["late_results_discarded"],
            "batches_lost": e.counters["batches_lost"],
            "handler_errors": e.counters["handler_errors"],
            "internal_errors": e.counters["internal_errors"],
        }
