"""What to do with one slice's outcome in a worker's result: decided once, by one pure function.

`classify` maps (the group's state, the outcome, the slice it answers) to a `Verdict`; the engine
applies it (core/engine.py). The failure taxonomy it encodes:

- FOLD: an "ok" outcome for the slice asked; its arrays are checked when they are folded (a malformed
  one is retried after all).
- RETRY: the worker's fault, fixed by running the slice again from its snapshots -- a transient fault
  (`worker_error`), an outcome for another request, an unreadable one, or no error code at all.
- FAIL: an error no retry can fix -- an exception inside the model (`model_error`), a request the model
  cannot run (its own codes): the group is answered at once. A code the scheduler owns (`shutting_down`,
  `deadline_unmeetable`, ...) is not the worker's to send: clients act on those (a resubmitting client
  waits out a shutdown; a rejection reads as refused at receipt), so the group fails as `model_error`,
  the worker's code in its message; so does a code no client could switch on (not a short snake_case word).
- OUT_OF_MEMORY: the rows did not fit; the worker holds fewer and the slice is planned again smaller.
- IGNORE: nothing to do -- the group already ended (a late answer), or the scheduler cancelled the slice
  (whatever comes back for it then concerns an ended group, even if a new group has taken its id).

A "cancelled" outcome the scheduler did not ask for is the worker's fault: retried.
"""

from __future__ import annotations

import enum
import re

from candidate_scheduler.core.access import FORBIDDEN
from candidate_scheduler.core.endings import INTERNAL_ERROR, REPLY_TOO_LARGE
from candidate_scheduler.core.errors import ERROR_CODES
from candidate_scheduler.core.group import REJECT_CODES
from candidate_scheduler.core.group_state import ERROR_CANCELLED, ERROR_DEADLINE_EXCEEDED, ERROR_RETRIES_EXHAUSTED
from candidate_scheduler.core.values import value

# Worker error codes a retry from snapshots can fix; every other error code ends the group at once.
RETRYABLE_ERRORS = frozenset({"worker_error"})
OUT_OF_MEMORY_CODE = "out_of_memory"
MODEL_ERROR = "model_error"
# The codes the scheduler's own answers carry: never believed from a worker
SCHEDULER_CODES = ERROR_CODES | REJECT_CODES | frozenset({
    INTERNAL_ERROR, FORBIDDEN, ERROR_CANCELLED, ERROR_DEADLINE_EXCEEDED, ERROR_RETRIES_EXHAUSTED, "shutting_down",
    "overloaded", "tenant_overloaded", "duplicate_request_id", "draining", "stopping", REPLY_TOO_LARGE,
    "unknown_worker", "reducer_error"})
_WORKER_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
# A worker's error message goes into the group's reply (and the retry log): a traceback fits, a message
# of megabytes made the reply that large, or over the message limit (answered reply_too_large).
MAX_WORKER_MESSAGE = 4000


class Verdict(enum.Enum):
    FOLD = "fold"
    RETRY = "retry"
    FAIL = "fail"
    OUT_OF_MEMORY = "out_of_memory"
    IGNORE = "ignore"


@value
class Classified:
    verdict: Verdict
    detail: str = ""  # why, for a retry or a failure (the worker's own message when it sent one)
    code: str | None = None  # FAIL: the group's error code


def classify(group_live: bool, expected_request_id: str, outcome, cancelled_here: bool = False) -> Classified:
    """`outcome` is a core.messages.SliceOutcome for the slice of `expected_request_id`; `cancelled_here`:
    the scheduler told the worker to drop that slice."""
    if not group_live or cancelled_here:
        return Classified(Verdict.IGNORE, "the group already ended")
    if outcome.request_id != expected_request_id:
        return Classified(Verdict.RETRY, "batch result answers another request")
    if outcome.status == "ok":
        if outcome.malformed is not None:
            return Classified(Verdict.RETRY, f"malformed result: {outcome.malformed}")
        return Classified(Verdict.FOLD)
    if outcome.status == "cancelled":
        return Classified(Verdict.RETRY, "the worker dropped a slice the scheduler did not cancel")
    message = _short(outcome.error)
    if outcome.status == "error" and outcome.error_code == OUT_OF_MEMORY_CODE:
        return Classified(Verdict.OUT_OF_MEMORY, message or "out of memory")
    if outcome.status == "error" and outcome.error_code and outcome.error_code not in RETRYABLE_ERRORS:
        code = outcome.error_code
        if not isinstance(code, str) or not _WORKER_CODE.fullmatch(code) or code in SCHEDULER_CODES:
            return Classified(Verdict.FAIL, f"the worker answered with code {str(code)[:64]!r}: "
                                            f"{message or 'no message'}", MODEL_ERROR)
        return Classified(Verdict.FAIL, message or code, code)
    return Classified(Verdict.RETRY, message or "worker error")


def _short(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_WORKER_MESSAGE:
        return message
    return f"{message[:MAX_WORKER_MESSAGE]}... ({len(message) - MAX_WORKER_MESSAGE} more characters)"
