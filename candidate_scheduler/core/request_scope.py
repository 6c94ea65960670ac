"""Whose request ids these are: with keys, each principal's request ids are its own.

A request id is the client's idempotency key (core/resubmission.py). With a key directory the
scheduler serves many principals, and were ids one namespace, another tenant using the same id
(`episode-3-step-17` is an obvious name) would be refused `duplicate_request_id` while the owner's
group ran, and once it ended would replace the reply its owner gets by resubmitting. So the engine
keys each group by its *scoped id*: the id the client chose, prefixed with the name of the principal
on the socket it came by (`robot-a/episode-3-step-17`). A proxy's groups live in the proxy's own
namespace, as its cancels do; it makes its ids unique among the clients it acts for (both fronts add a
random part). Principal names hold no "/" (core/access.py), so two principals' ids never meet. Without
keys every caller is one principal (`LOCAL`), and ids are not prefixed at all.

Replies carry the id the client sent, never the scoped one (the shell writes it back). Cancel and
status name the namespace they look in: the sender's own by default; naming another's is the way an
admin reaches a principal's group, and who may do what there is core/access.py's rule as before.

Nor does an error text name another principal's group: a worker's error for a whole batch, or an
exception inside an engine event, goes to every group it concerns, and may name one of them by its scoped
id (`group 'alice/x' ...`). Each group's copy has the other principals' ids taken out (`redacted`): those of
the live groups for an engine fault (rare: every id is looked for), those of the worker's assignments for
a worker's error. A group that has ended by then is not looked for; the log keeps the whole text.
"""

from __future__ import annotations

from collections.abc import Iterable

SEPARATOR = "/"


def scoped_id(scope: str | None, request_id: str) -> str:
    """The engine's key of `request_id` sent by the principal named `scope` (None: ids are not scoped)."""
    return request_id if scope is None else f"{scope}{SEPARATOR}{request_id}"


OTHERS = "<another principal's group>"


def redacted(text: str, own: str, others: Iterable[str]) -> str:
    """`text` as the group `own` may read it: each id among `others` of another principal's replaced by
    OTHERS. Only scoped ids can be told apart by principal: without keys (one principal, ids unscoped) the
    engine passes none."""
    if SEPARATOR not in text:
        return text  # the common case: no scoped id in it
    mine = own.partition(SEPARATOR)[0] if SEPARATOR in own else None
    # longest first: "a/x" must not be replaced inside "a/x2" before "a/x2" is
    for rid in sorted({r for r in others if SEPARATOR in r and r.partition(SEPARATOR)[0] != mine}, key=len,
                      reverse=True):
        text = text.replace(rid, OTHERS)
    return text
