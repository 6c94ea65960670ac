"""Cancellation races: cancels placed at random points relative to admission, dispatch, each
microbatch, reduction and the reply; storms of concurrent cancels of one id from many control
connections; cancels of ids nobody sent.

Oracle, per group: exactly one reply; at most one CANCEL says changed=True, and the reply is
"cancelled" iff one did; every other CANCEL names the state the group was really in ("unknown" before
the SUBMIT arrived, or the group's final status); STATUS afterwards equals the reply's status; a
cancelled reply carries no action, a done reply the fault-free one. At the end nothing is left in
flight (groups_in_flight == batches_in_flight == 0) and no handler raised.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from candidate_scheduler import protocol
from tests.reliability.helpers import (
    Ledger,
    RawPeer,
    ReplyReader,
    random_request,
    wait_quiescent,
)

pytestmark = pytest.mark.timeout(900)

PHASES = {  # phase -> weight
    "cancel-then-submit": 1,  # the CANCEL may overtake the SUBMIT (different sockets)
    "submit-then-cancel": 2,  # around admission
    "while-queued": 2,  # admitted, not dispatched (poll STATUS)
    "while-running": 3,  # in a physical batch (poll STATUS running_slices)
    "after-microbatch": 2,  # after the k-th microbatch folded (poll STATUS candidates_done)
    "around-reduction": 2,  # a tight loop of cancels while the last slice finishes, reduces, replies
    "after-reply": 1,
    "storm": 1,  # many concurrent cancels of the same id from several control connections
}
TERMINAL = {"done", "cancelled", "failed", "expired"}


class Ctl:
    """A control connection (raw DEALER): one request, one reply."""

    def __init__(self, endpoint: str):
        self.peer = RawPeer(endpoint)

    def call(self, kind: protocol.Kind, payload, timeout_s: float = 10.0) -> protocol.ControlReply:
        self.peer.send(protocol.encode(kind, payload))
        frames = self.peer.recv(timeout_s)
        if frames is None:
            raise TimeoutError(f"no control reply to {kind.name}")
        _k, msg = protocol.decode_frames(frames, {protocol.Kind.CONTROL_REPLY})
        return msg

    def cancel(self, rid: str) -> protocol.ControlReply:
        return self.call(protocol.Kind.CANCEL, protocol.CancelRequest(rid))

    def status(self, rid: str) -> protocol.ControlReply:
        return self.call(protocol.Kind.STATUS, protocol.StatusRequest(rid))

    def close(self) -> None:
        self.peer.close()


class Lane(threading.Thread):
    def __init__(self, handle, lane: int, races: int, seed: int, ledger: Ledger, storm_pool: int):
        super().__init__(daemon=True, name=f"cancel-lane-{lane}")
        self.handle = handle
        self.lane = lane
        self.races = races
        self.rnd = random.Random(seed)
        self.ledger = ledger
        self.storm_pool = storm_pool
        self.problems: list[str] = []
        self.phases = Counter()
        self.hits = Counter()  # where the changing cancel found the group
        self.cancels = 0
        self.changed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        self.reader = ReplyReader(self.handle.request, self.ledger)
        self.ctl = Ctl(self.handle.control)
        try:
            for r in range(self.races):
                self.race(r)
            self.reader.barrier()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.reader.close()
            self.ctl.close()

    def _poll_status(self, rid: str, want, timeout_s: float = 10.0) -> protocol.ControlReply:
        """STATUS until `want(reply)` or the group ended; returns the last STATUS."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.ctl.status(rid)
            if want(st) or st.state in TERMINAL or time.monotonic() > deadline:
                return st
            if rid not in self.reader.outstanding:
                return st

    def race(self, r: int) -> None:
        rnd = self.rnd
        phase = rnd.choices(list(PHASES), weights=list(PHASES.values()))[0]
        self.phases[phase] += 1
        rid = f"cx-{self.lane}-{r}"
        req = random_request(rnd, request_id=rid, max_count=10, steps=(3, 6))
        replies: list[protocol.ControlReply] = []
        if phase == "cancel-then-submit":
            # both in flight at once, on different sockets: either may be read first
            self.ctl.peer.send(protocol.encode(protocol.Kind.CANCEL, protocol.CancelRequest(rid)))
            self.reader.send(req)
            frames = self.ctl.peer.recv(10.0)
            if frames is None:
                raise TimeoutError("no control reply to CANCEL")
            replies.append(protocol.decode_frames(frames, {protocol.Kind.CONTROL_REPLY})[1])
        else:
            self.reader.send(req)
        if phase == "submit-then-cancel":
            replies.append(self.ctl.cancel(rid))
        elif phase == "while-queued":
            self._poll_status(rid, lambda s: s.state in ("queued", "admitted"))
            replies.append(self.ctl.cancel(rid))
        elif phase == "while-running":
            self._poll_status(rid, lambda s: s.state == "running" and s.detail.get("running_slices", 0) > 0)
            replies.append(self.ctl.cancel(rid))
        elif phase == "after-microbatch":
            k = rnd.randint(1, max(1, req.candidates.count // 4))
            self._poll_status(rid, lambda s: s.detail.get("candidates_done", 0) >= min(4 * k, req.candidates.count))
            replies.append(self.ctl.cancel(rid))
        elif phase == "around-reduction":
            count = req.candidates.count
            last = count - (count - 1) % 4 - 1  # candidates done before the last slice runs
            self._poll_status(rid, lambda s: s.detail.get("candidates_done", 0) >= last and s.state == "running")
            while rid in self.reader.outstanding:
                rep = self.ctl.cancel(rid)
                replies.append(rep)
                if rep.changed or rep.state in TERMINAL:
                    break
                self.reader.poll_once(0)
        elif phase == "storm":
            if rnd.random() < 0.5:
                self._poll_status(rid, lambda s: s.state == "running")
            replies += self.storm(rid)
        result = self.reader.wait(rid, 60)
        if phase == "after-reply":
            replies.append(self.ctl.cancel(rid))
            replies.append(self.ctl.cancel(rid))
        # unknown ids, interleaved
        ghost = self.ctl.cancel(f"ghost-{self.lane}-{r}-{rnd.randrange(10**9)}")
        if ghost.changed or ghost.state != "unknown":
            self.problems.append(f"cancel of an unknown id: {ghost}")
        self.cancels += len(replies) + 1
        self.check(rid, phase, result, replies)

    def storm(self, rid: str) -> list[protocol.ControlReply]:
        n = self.storm_pool
        ctls = [Ctl(self.handle.control) for _ in range(n)]
        barrier = threading.Barrier(n)
        out: list[protocol.ControlReply | BaseException] = [None] * n

        def one(i):
            try:
                barrier.wait(10)
                out[i] = ctls[i].cancel(rid)
            except BaseException as exc:  # noqa: BLE001
                out[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for c in ctls:
            c.close()
        errors = [o for o in out if not isinstance(o, protocol.ControlReply)]
        if errors:
            self.problems.append(f"storm on {rid}: {errors[:2]}")
        return [o for o in out if isinstance(o, protocol.ControlReply)]

    def check(self, rid: str, phase: str, result: protocol.GroupResult, replies: list[protocol.ControlReply]) -> None:
        changed = [r for r in replies if r.changed]
        self.changed += len(changed)
        final = self.ctl.status(rid).state
        where = f"{rid} ({phase})"
        if len(changed) > 1:
            self.problems.append(f"{where}: {len(changed)} cancels said changed=True")
        if changed:
            self.hits[changed[0].state] += 1
            if result.status != "cancelled":
                self.problems.append(f"{where}: a cancel changed it (from {changed[0].state}) but the reply is {result.status}")
            if changed[0].state not in ("queued", "admitted", "running", "reducing"):
                self.problems.append(f"{where}: changed=True from state {changed[0].state}")
        else:
            self.hits["not-cancelled:" + result.status] += 1
            if result.status == "cancelled":
                self.problems.append(f"{where}: reply cancelled but no cancel said changed=True")
        for r in replies:
            if not r.ok:
                self.problems.append(f"{where}: cancel not ok: {r.error}")
            if not r.changed and r.state not in ("unknown", result.status, "queued", "admitted", "running", "reducing"):
                self.problems.append(f"{where}: unchanged cancel reports {r.state}, reply was {result.status}")
            if not r.changed and r.state in ("queued", "admitted", "running", "reducing"):
                # an unchanged cancel of a live group is only possible if another cancel won the race
                if not changed:
                    self.problems.append(f"{where}: cancel left a live group ({r.state}) alone")
        if final != result.status:
            self.problems.append(f"{where}: STATUS afterwards is {final}, the reply was {result.status}")
        if result.status not in ("done", "cancelled"):
            self.problems.append(f"{where}: unexpected status {result.status}: {result.error}")


def test_cancellation_races(services, reliability, rng_seed):
    sched = services.scheduler("--heartbeat-interval", "0.05")
    for _ in range(2):
        services.worker(sched, capacity=4, step_delay=0.03)
    sched.wait_workers(2)
    s = reliability.scale
    ledger = Ledger()
    per_lane = max(1, s.cancel_races // s.cancel_lanes)
    lanes = [Lane(sched, i, per_lane, rng_seed * 31 + i, ledger, storm_pool=6) for i in range(s.cancel_lanes)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join(600)
    for lane in lanes:
        assert lane.error is None, f"lane {lane.lane}: {lane.error!r}"
    st = wait_quiescent(sched)
    assert st["handler_errors"] == 0
    problems = [p for lane in lanes for p in lane.problems]
    phases = sum((lane.phases for lane in lanes), Counter())
    hits = sum((lane.hits for lane in lanes), Counter())
    cancels = sum(lane.cancels for lane in lanes)
    races = sum(phases.values())
    reliability.add("cancel", "races: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())), races,
                    f"{cancels} cancels sent ({sum(lane.changed for lane in lanes)} changed, the rest no-ops incl. "
                    f"{races} unknown ids); outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(hits.items()))
                    + "; one reply per group, status == reply, 0 groups / 0 batches left in flight",
                    ok=not problems)
    ledger.assert_clean(reliability)
    assert not problems, problems[:15]


def test_cancel_storms_from_many_connections(services, reliability, rng_seed):
    """Each target id gets cancels from 16 control connections released by one barrier, while queued
    (no worker yet) or while running; exactly one says changed=True."""
    sched = services.scheduler("--heartbeat-interval", "0.05")
    rnd = random.Random(rng_seed)
    ledger = Ledger()
    reader = ReplyReader(sched.request, ledger)
    n_ids = reliability.scale.storm_ids
    conns = 16
    ctls = [Ctl(sched.control) for _ in range(conns)]
    outcomes = Counter()
    problems = []
    worker_started = False
    try:
        for k in range(n_ids):
            rid = f"storm-{k}"
            reader.send(random_request(rnd, request_id=rid, max_count=8, steps=(50, 60)))
            if k >= n_ids // 2 and not worker_started:
                services.worker(sched, capacity=8, step_delay=0.03)
                sched.wait_workers(1)
                worker_started = True
            want = "running" if worker_started else "queued"
            probe = Ctl(sched.control)
            deadline = time.monotonic() + 30
            while probe.status(rid).state != want and time.monotonic() < deadline:
                pass
            probe.close()
            barrier = threading.Barrier(conns)
            out = [None] * conns

            def one(i):
                barrier.wait(10)
                out[i] = ctls[i].cancel(rid)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(conns)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            changed = [o for o in out if o is not None and o.changed]
            outcomes[f"{want}: changed {len(changed)}/{conns}"] += 1
            if len(changed) != 1 or any(o is None for o in out):
                problems.append(f"{rid}: {len(changed)} of {conns} cancels changed it ({out})")
            if any(o is not None and not o.changed and o.state not in ("cancelled", want) for o in out):
                problems.append(f"{rid}: a losing cancel reported {[o.state for o in out if o]}")
            r = reader.wait(rid, 30)
            if r.status != "cancelled":
                problems.append(f"{rid}: reply {r.status}")
        wait_quiescent(sched)
        reader.barrier()
    finally:
        for c in ctls:
            c.close()
        reader.close()
    reliability.add("cancel", f"storms: {conns} concurrent cancels of one id, {n_ids} ids ("
                    + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())) + ")", n_ids * conns,
                    "exactly one changed=True per id, one cancelled reply, nothing left in flight", ok=not problems)
    ledger.assert_clean(reliability)
    assert not problems, problems[:10]
