"""An assignment's BATCH_RESULT as the worker encodes it: one answer that always travels.

The answer is encoded whole, once, as a rule. When that fails or is too large, each group's output is
encoded on its own, so one the wire cannot carry (a dtype it has no name for, a numpy scalar among the
candidate ids) fails that group alone, as a model error, like a `finish` that raised; the groups beside
it keep their results. A report that cannot be made or encoded is left out.

The scheduler's socket drops a message over `protocol.MAX_MESSAGE_BYTES` together with the connection,
and retries the whole assignment once heartbeats stop listing it: it would come back just as large,
every time. So an answer over the limit gives up outputs, largest first, until it fits: one that alone
would be over the limit fails for good (`result_too_large`: a retry computes the same bytes), one that
only did not fit beside the others is the worker's fault (`worker_error`), retried from its snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec

from candidate_scheduler import convert, protocol
from candidate_scheduler.core.work import GroupOutput
from candidate_scheduler.worker import stepping

log = logging.getLogger("candidate_scheduler.worker")

TOO_LARGE = "result_too_large"
_ENCODER = msgspec.msgpack.Encoder()


def encode_result(worker_id: str, batch_id: int, outputs: Sequence[GroupOutput],
                  report: Callable[[], dict]) -> list[bytes]:
    """The frames of the assignment's BATCH_RESULT (`report()`: its report)."""
    try:
        wire_report = report()
    except Exception:  # noqa: BLE001 - a report is for the cost model and metrics: answered without it
        log.exception("the report of assignment %d could not be made: answered without it", batch_id)
        wire_report = {}
    try:  # the common case, one encoding of the whole answer
        frames = protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(
            worker_id, batch_id, [convert.output_to_wire(o) for o in outputs], wire_report))
        if len(frames[1]) <= protocol.MAX_MESSAGE_BYTES:
            return frames
    except Exception:  # noqa: BLE001 - an output or the report cannot travel: found below, one by one
        pass
    ids = [o.request_id for o in outputs]
    # pre-encoded (msgspec.Raw): each output's bytes are known, and copied once more into the message
    raws = [_encoded(batch_id, o) for o in outputs]
    try:
        frames = protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(worker_id, batch_id, raws,
                                                                                     wire_report))
    except Exception:  # noqa: BLE001 - the outputs are encoded already: only the report can fail here
        log.exception("the report of assignment %d could not be encoded: answered without it", batch_id)
        wire_report = {}
        frames = protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(worker_id, batch_id, raws))
    if len(frames[1]) <= protocol.MAX_MESSAGE_BYTES:
        return frames
    total = len(frames[1])
    overhead = total - sum(len(r) for r in raws)
    for i in sorted(range(len(raws)), key=lambda i: -len(raws[i])):
        if total <= protocol.MAX_MESSAGE_BYTES:
            break
        size = len(raws[i])
        if overhead + size > protocol.MAX_MESSAGE_BYTES:
            code, text = TOO_LARGE, (f"the group's result is {size} bytes, over the {protocol.MAX_MESSAGE_BYTES}-byte "
                                     "message limit")
        else:
            code, text = "worker_error", "its result did not fit in one message beside the rest of its assignment"
        log.warning("assignment %d: group %s answered %s (%d bytes)", batch_id, ids[i], code, size)
        raws[i] = msgspec.Raw(_ENCODER.encode(protocol.GroupOutputMsg(ids[i], "error", error=text, error_code=code)))
        total += len(raws[i]) - size
    return protocol.encode(protocol.Kind.BATCH_RESULT, protocol.BatchResultMsg(worker_id, batch_id, raws,
                                                                                wire_report))


def _encoded(batch_id: int, o: GroupOutput) -> msgspec.Raw:
    try:
        return msgspec.Raw(_ENCODER.encode(convert.output_to_wire(o)))
    except Exception as exc:  # noqa: BLE001 - what the adapter made fails its own group, not the assignment
        log.exception("assignment %d: the output of group %s could not be encoded", batch_id, o.request_id)
        return msgspec.Raw(_ENCODER.encode(convert.output_to_wire(stepping.error_output(o.request_id, exc))))

