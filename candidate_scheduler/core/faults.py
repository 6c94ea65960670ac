"""A fault inside an event, answered: the engine's side of "no event raises" (core/engine.py, "Atomic
events").

`Faults` holds no state of its own: it is the part of the engine that answers the groups a failing step
was working on, as core/endings.py is the part that answers a group that ended. Each such group is
answered once, `failed` with `internal_error` naming the exception, through the same door as every other
ending; if that door raises too, the last resort answers it plainly and forgets it. The fault itself goes
to the shell as an `InternalFault` message (logged there with its traceback) and is counted.
"""

from __future__ import annotations

import contextlib
import traceback

from candidate_scheduler.core.group import refusal
from candidate_scheduler.core.group_state import INTERNAL_ERROR
from candidate_scheduler.core.messages import InternalFault, Reply
from candidate_scheduler.core.request_scope import SEPARATOR, redacted


class Faults:
    def __init__(self, engine):
        self.engine = engine

    def report(self, event: str, exc: BaseException, request_ids=(), answered=()) -> None:
        """Count and report the fault (InternalFault), and answer the groups of `request_ids` internal_error;
        `answered`: groups already answered so (named in the log)."""
        e = self.engine
        text = f"{type(exc).__name__}: {exc}"
        ids = tuple(dict.fromkeys(request_ids))
        # the text may name any group, not only those it fails; a fault is rare, so every live id is looked for
        named = (*ids, *e.groups) if e.scoped_ids and SEPARATOR in text else ()
        failed = tuple(rid for rid in ids if rid and self._fail(rid, event, redacted(text, rid, named)))
        e.outbox.append(self.message(event, exc, (*answered, *failed)))

    def message(self, event: str, exc: BaseException, answered: tuple) -> InternalFault:
        """The message that reports a fault to the shell (which logs it), counted."""
        e = self.engine
        e.counters["internal_errors"] += 1
        with contextlib.suppress(Exception):
            e.metrics.internal_error(event)
        return InternalFault(event, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc)), answered)

    def _fail(self, rid: str, event: str, text: str) -> bool:
        """Answer the group `rid` internal_error; whether this answered it."""
        e = self.engine
        g = e.groups.get(rid)
        if g is None:
            # an ended group's leftover (a forgetting step that raised): while it stays queued every planning
            # pass that picks it raises again, so it goes now
            with contextlib.suppress(Exception):
                e.pending.discard_group(rid)
            with contextlib.suppress(Exception):
                e.elastic.discard(rid)
            return False
        if g.reply_taken:
            return False
        message = f"internal error while handling {event}: {text}"
        try:
            if not g.finished:
                g.fail(INTERNAL_ERROR, message)
            e.end(g)
        except Exception:  # noqa: BLE001 - the last resort: forget it and answer it plainly
            if not g.reply_taken:
                g.take_reply()
                answer = refusal(rid, "failed", INTERNAL_ERROR, message)
                e.outbox.append(Reply(g.client, answer))
                e.outbox.extend(Reply(waiter, answer) for waiter in g.waiters)  # its resubmissions too
                with contextlib.suppress(Exception):  # an answer sent is an answer counted, as Endings.end does
                    e.metrics.group_completed("failed", e.now - g.received_at)
                    e.metrics.tenant_group(g.tenant, "failed", 0)
            # its slices still out are the ended group's (Endings.end marks them as it tells their workers):
            # else a late result of one is taken for a new group's slice under the same id
            for batch_id in e.held.get(rid, ()):
                if (a := e.assignments.get(batch_id)) is not None:
                    a.cancelled.add(rid)
            with contextlib.suppress(Exception):  # every step of it ran (core/endings.py); a second fault here
                e.endings.forget(g)
        return True
