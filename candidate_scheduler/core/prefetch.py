"""How early a worker's next work is sent (late prefetch), learned from the worker's own starvation.

Late prefetch (core/snapshot.py, `PlanningSnapshot.prefetch_due_at`) sends the work a busy worker will
hold next `lead` seconds before it is predicted to need it. The configured lead covers the link; what
it cannot see is how late the scheduler itself runs: a loop that is busy with a burst wakes late, and
a forecast can run long. Either way the worker ends its batch with nothing to start, and waits a
round trip for the next -- a cost that sending at once never has. So each worker's lead carries an
extra margin learned from that signal alone: a result that leaves its worker with nothing to run while
work waits in the queue doubles the margin; every other result shrinks it a little. On a quiet
scheduler it stays near zero (the lead is the configured one); on a saturated one it grows until the
work goes out in time -- towards sending at once, which is what a saturated scheduler should do.
"""

from __future__ import annotations

GROWTH = 2.0  # the margin's factor after a starved result
DECAY = 0.98  # and after any other: the margin settles where about 3% of batches end starved
CAP_S = 60.0  # more than any batch: a margin this large sends everything at once
FIRST_S = 0.005  # the first step, when the configured lead is smaller


def next_margin(margin_s: float, starved: bool, lead_s: float) -> float:
    """A worker's extra lead after one of its results (`lead_s`: the configured lead, the first step)."""
    if starved:
        return min(CAP_S, max(GROWTH * margin_s, lead_s, FIRST_S))
    return margin_s * DECAY
