"""The bridge's counts for the scheduler's /metrics (COMPAT_REPORT) and its log, with the scheduler away
or a peer sending garbage: counts a report could not deliver go with the next one, not lost for good,
and refused payloads do not write a warning each."""

from __future__ import annotations

import asyncio
import logging

import pytest

from candidate_scheduler import protocol
from candidate_scheduler.compat import bridge as bridge_mod
from candidate_scheduler.compat.unpickle import RefusedPickle
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(60)


def test_counts_a_report_could_not_deliver_go_with_the_next(monkeypatch):
    monkeypatch.setattr(bridge_mod, "REPORT_INTERVAL_S", 0.05)

    async def main():
        away = f"tcp://127.0.0.1:{free_port()}"
        b = bridge_mod.Bridge(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler=away, control=away))
        b.bind()
        sent = []

        async def control_send(frames):  # the scheduler away long enough that the socket's queue is full
            sent.append(frames)
            return delivered

        b._control_send = control_send
        delivered = False
        serving = asyncio.create_task(b.serve())
        try:
            b._count("req")
            b._count("req")
            b._count("busy", error=True)
            await asyncio.sleep(0.3)  # several reports tried, none delivered
            assert len(sent) >= 2
            assert b._report_requests == {"req": 2} and b._report_errors == {"busy": 1}
            b._count("req")
            delivered = True
            await asyncio.sleep(0.2)
            assert b._report_requests == {} and b._report_errors == {}
            last = protocol.decode(protocol.Kind.COMPAT_REPORT, sent[-1][1])
            assert last.requests == {"req": 3} and last.errors == {"busy": 1}
        finally:
            b.stopping.set()
            await serving
            b.close()

    asyncio.run(main())


def test_a_flood_of_refused_payloads_logs_a_few_lines_not_one_each(caplog):
    b = bridge_mod.Bridge(bridge_mod.BridgeConfig(bind="tcp://127.0.0.1:0", scheduler="tcp://127.0.0.1:1"))
    with caplog.at_level(logging.WARNING, logger="candidate_scheduler.compat.bridge"):
        for _ in range(2500):
            b._note_refusal(RefusedPickle("global 'os.system' is not allowed"))
    assert b.stats["pickle_refused"] == 2500
    assert 10 <= len(caplog.records) <= 12 and "refused payloads so far: 2000" in caplog.records[-1].getMessage()
