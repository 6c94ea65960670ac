"""A seeded random driver of the engine (core/engine.py) checking its exactly-once and accounting invariants
after every call: every submission is answered once (its client, each waiter), and only for what it asked
(a candidate's values are its seed's); the gauges and counters match a recount of the engine's state; and
once the fleet keeps answering, every group ends and nothing of it is left behind.

Fake workers answer from the seeds (tests/unit/test_engine.expected), or fail, run out of memory, drop work
on the link, die, leave, give work back and register again; clients submit, resubmit (the same or other
content), cancel (their own, others', as admin), over tenants' limits, with and without request scopes.
More seeds or longer runs: `run_seed(seed, steps, faults)` in a loop (a failure names its seed and last calls).
"""

from __future__ import annotations

import collections
import hashlib
import random

import numpy as np
import pytest

from candidate_scheduler.core import reducers
from candidate_scheduler.core.access import LOCAL, Principal, Role
from candidate_scheduler.core.engine import Engine, EngineConfig
from candidate_scheduler.core.graceful_stop import GracefulStop, Verdict, serving_workers
from candidate_scheduler.core.group_state import GroupStatus, WorkStatus
from candidate_scheduler.core.messages import (
    LEAVE,
    REREGISTER,
    CancelRows,
    GiveBack,
    Heartbeat,
    InternalFault,
    Leaving,
    Left,
    Registration,
    Reply,
    SendWork,
    SliceOutcome,
    StopWorker,
    WorkerResult,
)
from candidate_scheduler.core.request import validate
from candidate_scheduler.core.tenants import TenantPolicy
from tests.unit.test_engine import IMAGE, capability, expected, submission

ALICE = Principal("alice", "robots", Role.CLIENT)
BOB = Principal("bob", "robots", Role.CLIENT)
CAROL = Principal("carol", "lab", Role.CLIENT)
ADMIN = Principal("ops", "default", Role.ADMIN)
FRONT = Principal("front", "default", Role.PROXY)
CLIENTS = (ALICE, BOB, CAROL)
BIG = {"height": 128, "width": 128}  # a second forward shape
LABELS = ("64x64h16f5", "128x128h16f5")


class Metrics:
    """Counts each metric call by name (an answer is counted once: `group_completed`); with `p`, a call raises
    now and then (a metric backend's bug): every event must still answer each group once and leave nothing
    behind (core/engine.py, "atomic events")."""

    def __init__(self, rng: random.Random, p: float):
        self.rng, self.p, self.on = rng, p, p > 0
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name: str):
        def call(*args, **_kwargs):
            self.calls[name] += 1
            if name == "resubmission":
                self.calls[f"resubmission_{args[0]}"] += 1
            # (forbidden: counted by cancel and status before any event, outside the engine's guard)
            if self.on and name != "forbidden" and self.rng.random() < self.p:
                raise RuntimeError(f"injected: {name}")
        return call


class FakeWorker:
    def __init__(self, wid: str, incarnation: int):
        self.wid = wid
        self.identity = f"{wid}#{incarnation}".encode()
        self.held: dict[int, SendWork] = {}  # batch id -> work it holds and has not answered
        self.cancelled: dict[int, set[str]] = collections.defaultdict(set)
        self.alive, self.leaving, self.cuda = True, False, False  # alive: it beats and answers
        self.told: str | None = None  # the last StopWorker reason it was sent


class Fuzz:
    def __init__(self, seed: int, faults: float = 0.0):
        self.rng = r = random.Random(seed)
        self.faults = faults > 0
        self.metrics = Metrics(random.Random(seed + 1), faults)
        self.scoped = r.random() < 0.4
        self.fleet = r.choice([1, 2, 4, 6])  # worker ids in use
        self.tenants = (TenantPolicy("robots", max_in_flight=r.choice([None, 2, 4])),
                        TenantPolicy("lab", max_in_flight=r.choice([None, 1, 3]), weight=r.choice([0.5, 1.0, 2.0])))
        self.config = EngineConfig(
            batching=r.choice(["dispatch", "step"]), prefetch=r.choice([0, 0, 1, 2]),
            prefetch_lead_s=r.choice([0.01, float("inf")]), stagger=r.random() < 0.5,
            policy=r.choice(["microbatch", "microbatch", "sequential", "reject"]), retry_limit=r.choice([1, 2, 3]),
            max_queued_groups=r.choice([3, 8, 1024]), replies_kept=r.choice([0, 2, 1024]),
            tenants=self.tenants, fair_queueing=r.random() < 0.7, finished_memory=r.choice([3, 10_000]))
        self.e = Engine(self.config, metrics=self.metrics)
        self.plan_now, self.counted_before, self.now = True, 0, 100.0
        self.stop: GracefulStop | None = None
        self.workers: dict[str, FakeWorker] = {}  # by worker id: the newest incarnation
        self.all_work: list[SendWork] = []
        self.debt: collections.Counter = collections.Counter()  # client -> answers it is owed
        self.got: collections.Counter = collections.Counter()  # client -> answers it had
        self.seeds_of: dict = {}  # client -> the candidate seeds its submission asked for
        self.admitted: set[str] = set()  # scoped ids ever kept by the engine
        self.sent_ids: list[tuple[Principal, str, str | None]] = []  # (principal, request id, scope)
        self.key_of: dict = {}  # client -> (scoped id, content) of its submission
        self.content_of: dict = {}  # (scope, request id) -> the content last sent under it
        self.cancel_asked: set[str] = set()
        self.owners: dict[str, tuple[str, ...]] = {}  # scoped id -> who submitted its latest group
        self.calls = self.n_clients = self.incarnations = 0
        self.log: list[str] = []

    # ---- messages out ---------------------------------------------------------------------------------

    def take(self, out: list) -> None:
        self.calls += 1
        if not self.faults:
            # every answer is counted once, when it is made: not its copies to waiters, nor a kept one resent
            answers = len({id(m.result) for m in out if isinstance(m, Reply)})
            counted = self.metrics.calls["group_completed"] + self.metrics.calls["resubmission_answered"]
            assert answers == counted - self.counted_before, (answers, counted - self.counted_before)
            self.counted_before = counted
        for m in out:
            if isinstance(m, Reply):
                self.got[m.client] += 1
                assert self.got[m.client] <= self.debt[m.client], (m.client, "more than owed", m.result.status)
                self._check_result(m.client, m.result)
            elif isinstance(m, SendWork):
                self.all_work.append(m)
                w = self._worker_of(m.identity)
                assert w is not None, f"work sent to an unknown identity {m.identity}"
                w.held[m.batch_id] = m
                self._check_sent(w, m)
            elif isinstance(m, CancelRows):
                w = self._worker_of(m.identity)
                if w is not None:
                    w.cancelled[m.batch_id].update(m.request_ids)
            elif isinstance(m, StopWorker):
                w = self._worker_of(m.identity)
                if w is not None:
                    w.told = m.reason
            elif isinstance(m, InternalFault) and not self.faults:
                raise AssertionError(f"internal fault in {m.event}: {m.error}\n{m.traceback}")
        self.check()

    def _check_sent(self, w, m) -> None:
        """Work goes to a live worker, of a shape it takes, within the rows it may hold."""
        state = self.e.workers.get(w.wid)
        assert state is not None and state.identity == m.identity, f"work {m.batch_id} sent to a gone or leaving worker"
        rows = sum(len(sw.dispatch.candidate_ids) for sw in m.slices)  # candidates (Assignment.rows)
        assert 0 < rows <= state.rows, f"batch {m.batch_id} of {rows} rows to {w.wid} holding {state.rows}"
        for sw in m.slices:
            assert sw.group.label not in state.refused_labels, f"a refused shape sent to {w.wid}"
        held = sum(a.rows for a in state.assignments.values())
        if self.config.batching == "step":
            assert held <= state.rows * (1 + self.config.prefetch), f"{w.wid} holds {held} rows of {state.rows}"
        else:
            assert len(state.assignments) <= 1 + self.config.prefetch, f"{w.wid} holds too many batches"

    def _worker_of(self, identity):
        for w in self.workers.values():
            if w.identity == identity:
                return w
        return None

    def _check_result(self, client, res) -> None:
        want = self.seeds_of.get(client)
        key, content = self.key_of[client]
        if res.status == "cancelled":
            assert key in self.cancel_asked, f"{key}: cancelled, and nobody asked"
        if res.status == "expired":
            assert content.get("deadline_s") is not None, f"{key}: expired without a deadline"
        if res.status == "done":
            assert want is not None, f"{client}: done for a submission that asked nothing"
            seeds = tuple(res.candidate_seeds)
            assert 0 < len(seeds) <= len(want) and seeds == want[:len(seeds)], (client, seeds, want)
            n_obs = 2 if content.get("batched") else 1
            want_rows = np.stack([expected(s, n_obs) if n_obs > 1 else expected(s)[0] for s in seeds])
            np.testing.assert_array_equal(res.candidates, want_rows)
            stacked = np.stack([expected(s, n_obs) for s in seeds]).astype(np.float32)  # [n, B, H, D]
            want_action = reducers.reduce(content.get("reducer", "mean"), stacked)
            np.testing.assert_array_equal(res.action, want_action if n_obs > 1 else want_action[0])
            # all it asked for, or (an elastic count under a deadline) at least its minimum
            assert res.served_count == len(seeds) >= (content.get("candidates_min") or content["count"])

    # ---- invariants -----------------------------------------------------------------------------------

    def check(self) -> None:
        e = self.e
        assert set(e.groups) <= self.admitted
        # the pending index against a recount
        units = [u for rid in list(e.pending._units) for u in e.pending.units_of(rid)]
        assert e.pending.candidates == sum(u.size for u in units), "pending candidates gauge"
        assert len(e.pending) == len(units)
        for bucket in e.pending._buckets.values():
            assert len(bucket) > 0
        for u in units:
            g = e.groups.get(u.request_id)
            assert g is not None, f"pending unit of a forgotten group {u.request_id}"
            assert g.slice_status(u.slice_index) is WorkStatus.PENDING
        for rid, g in e.groups.items():
            if g.status in (GroupStatus.ADMITTED, GroupStatus.RUNNING):
                assert {i for i, _ids in g.pending_slices()} == set(e.pending._units.get(rid, {})), rid
            assert not g.finished, f"{rid} ended and still kept"
        # unstarted and waiting
        assert e.unstarted == {rid for rid, g in e.groups.items() if g.status is GroupStatus.ADMITTED}
        assert set(e.waiting) <= {rid for rid, g in e.groups.items() if g.status is GroupStatus.QUEUED}
        assert e.queued_groups() == len(e.waiting) + len(e.unstarted)
        # assignments against the workers that hold them
        holders = {**e.leaving, **e.workers}
        assert not (e.workers.keys() & e.leaving.keys())
        for bid, a in e.assignments.items():
            w = holders.get(a.worker_id)
            assert w is not None and w.assignments.get(bid) is a, f"assignment {bid} held by nobody"
        for w in holders.values():
            assert w.rows_in_use == sum(a.rows for a in w.assignments.values()), f"{w.worker_id} rows in use"
            for bid in w.assignments:
                assert bid in e.assignments
        held = collections.defaultdict(set)
        for bid, a in e.assignments.items():
            for entry in a.entries:
                if entry.request_id not in a.cancelled:
                    held[entry.request_id].add(bid)
        assert {k: v for k, v in e.held.items()} == dict(held), "held vs assignments"
        for rid, bids in held.items():
            g = e.groups.get(rid)
            assert g is not None, f"a live assignment of a forgotten group {rid}"
            running = {(e.assignments[b].worker_id, en.slice_index) for b in bids
                       for en in e.assignments[b].entries if en.request_id == rid}
            assert running == {(w, i) for i, w in g.running_slices().items()}, rid
        for rid, g in e.groups.items():
            if g.running_slices():
                assert rid in held, f"{rid} has running slices no assignment holds"
        # tenants
        assert dict(e.tenants.in_flight) == dict(collections.Counter(g.tenant for g in e.groups.values()))
        assert set(e.tenants.owners) == set(e.groups)
        assert e.tenants.clock.queued == sum(1 for g in e.groups.values() if g.fair_tag is not None)
        assert set(e.elastic) <= e.unstarted, "elastic entries of started or forgotten groups"
        # per-worker bookkeeping of workers that are gone
        assert set(e.held_back) <= set(e.workers), "staggered starts of gone workers"
        assert set(e.prefetch_margin) | set(e.cache_bytes) <= set(holders), "margins or caches of gone workers"
        assert set(e.cost.workers) <= set(holders), "cost models of gone workers"
        assert len(e.finished) <= self.config.finished_memory and len(e.replies) <= self.config.replies_kept
        assert len(e.expiries) <= 2 * len(e.groups) + 257
        for rid, g in e.groups.items():
            assert e.status(rid, ADMIN).state == g.status.name.lower()

    # ---- the driver -----------------------------------------------------------------------------------

    def new_client(self, name: str):
        self.n_clients += 1
        return (name, self.n_clients)

    def submit(self) -> None:
        r = self.rng
        e = self.e
        if self.sent_ids and r.random() < 0.35:  # a resubmission of an id sent before
            principal, rid, scope = r.choice(self.sent_ids)
            if r.random() < 0.3:
                principal = r.choice(CLIENTS) if self.scoped or principal is not LOCAL else principal
                scope = principal.name if self.scoped and scope != "front" else scope
            same = r.random() < 0.7
            content = self.content_of.get((scope, rid)) if same else None
        else:
            principal = r.choice(CLIENTS) if (self.scoped or r.random() < 0.5) else LOCAL
            rid = f"g{r.randrange(1000)}"
            scope = principal.name if self.scoped else None
            if self.scoped and r.random() < 0.2:
                scope = "front"  # a proxy's, acting for the principal, in the proxy's namespace
            content = None
        if content is None:
            content = dict(count=r.randint(1, 12), seed=r.randrange(1, 10**6), steps=r.choice([2, 4]))
            if r.random() < 0.25:
                content["sampling"] = BIG
            if r.random() < 0.15:  # two observations a candidate: rows of two
                content["batched"] = True
            if r.random() < 0.3:
                content["reducer"] = r.choice(["median", "medoid"])
            if r.random() < 0.3:
                content["candidates_min"] = r.randint(1, content["count"])
            if r.random() < 0.3:
                content["deadline_s"] = r.choice([0.5, 2.0, 10.0])
        self.content_of[(scope, rid)] = content
        kw = dict(content)
        if kw.pop("batched", False):
            kw.update(batched=True, images=np.stack([IMAGE, IMAGE]))
        sub = submission(rid, scope=scope, **kw)
        fingerprint = hashlib.sha256(repr(sorted((k, str(v)) for k, v in content.items())).encode()).digest()
        key = sub.scoped_id
        g = e.groups.get(key)
        if g is not None and g.fingerprint == fingerprint and principal.name in e.tenants.owners_of(key) \
                and r.random() < 0.3:
            client = g.client  # resent on the connection it came by: owed nothing more
        else:
            client = self.new_client(principal.name)
            self.debt[client] += 1
            try:
                self.seeds_of[client] = tuple(validate(sub).spec.candidate_seeds(content["seed"]))
            except Exception:  # noqa: BLE001 - an invalid request is refused: never done
                self.seeds_of[client] = None
        self.key_of.setdefault(client, (key, content))
        self.sent_ids.append((principal, rid, scope))
        via = "front" if scope == "front" else None
        self.log.append(f"submit {key} {content} by {principal.name} via {via} client {client}")
        serial = e.serial
        out = e.submit(client, sub, self.now, principal=principal, fingerprint=fingerprint, plan=self.plan_now,
                       via=via)
        if key in e.groups:
            self.admitted.add(key)
        if e.serial != serial:  # a new group was kept under the id (it may have ended at once: refused)
            self.admitted.add(key)
            self.owners[key] = (principal.name,) if via is None else (principal.name, via)
        self.take(out)

    def register(self, wid: str | None = None) -> None:
        r = self.rng
        wid = wid or f"w{r.randrange(self.fleet)}"
        self.incarnations += 1
        old = self.workers.get(wid)
        w = FakeWorker(wid, self.incarnations)
        if old is not None and r.random() < 0.3:
            w.identity = old.identity  # the same connection registers again (a restart behind it)
        self.workers[wid] = w
        cap = r.choice([1, 2, 3, 4, 8])
        self.log.append(f"register {wid} {w.identity} cap {cap}")
        profile = ()
        if r.random() < 0.6:  # a calibrated cost model: deadline forecasts, resizes and staggered starts
            k = r.choice([0.5, 1.0, 3.0])
            profile = tuple((label, rows, k * t * (2 if label == LABELS[1] else 1)) for label in LABELS
                            for rows, t in ((0, 0.2), (1, 0.03), (4, 0.05), (8, 0.08)))
        cuda = r.random() < 0.3  # rows capped by the predicted peak memory, as results report it
        w.cuda = cuda
        reg = Registration(wid, capability(8), cap, device="cuda" if cuda else "cpu", profile=profile,
                           memory_budget_bytes=r.choice([1000, 5000]) if cuda else 0)
        self.take(self.e.register(w.identity, reg, self.now))

    def answer(self, w: FakeWorker, bid: int, mode: str | None = None) -> None:
        r = self.rng
        send = w.held.pop(bid)
        mode = mode or r.choices(["ok", "retry", "fail", "oom", "oom_rows", "cancelled", "short", "garbage",
                                  "swapped"], [12, 2, 1, 1, 1, 1, 0.3, 0.5, 0.3])[0]
        outputs = []
        report = {"transformer_forwards": 2, "wall_s": r.choice([0.01, 0.1, 0.5])}
        if w.cuda and r.random() < 0.5:
            rows = sum(len(sw.dispatch.candidate_ids) for sw in send.slices)
            report.update(rows=rows, peak_memory_bytes=r.choice([200, 400]) + rows * r.choice([300, 900]))
        for sw in send.slices:
            d = sw.dispatch
            if d.request_id in w.cancelled.get(bid, ()) and r.random() < 0.5:
                outputs.append(SliceOutcome(d.request_id, "cancelled"))
            elif mode == "ok":
                acts = np.stack([expected(s, sw.group.request.observations) for s in d.seeds])
                outputs.append(SliceOutcome(d.request_id, "ok", d.candidate_ids, acts))
            elif mode == "retry":
                outputs.append(SliceOutcome(d.request_id, "error", error="flaky", error_code="worker_error"))
            elif mode == "fail":
                outputs.append(SliceOutcome(d.request_id, "error", error="bad input", error_code="bad_observation"))
            elif mode in ("oom", "oom_rows"):
                outputs.append(SliceOutcome(d.request_id, "error", error="oom", error_code="out_of_memory"))
                if mode == "oom_rows":
                    report["oom_rows"] = r.randint(1, max(1, sum(len(s.dispatch.candidate_ids) for s in send.slices)))
                    report["oom_step"] = r.randrange(3)
            elif mode == "cancelled":
                outputs.append(SliceOutcome(d.request_id, "cancelled"))
            elif mode == "garbage":  # another's candidate ids, a wrong shape, or non-finite values
                acts = np.stack([expected(s, sw.group.request.observations) for s in d.seeds])
                kind = r.randrange(3)
                if kind == 0:
                    outputs.append(SliceOutcome(d.request_id, "ok", tuple(c + 1 for c in d.candidate_ids), acts))
                elif kind == 1:
                    outputs.append(SliceOutcome(d.request_id, "ok", d.candidate_ids, acts[:, :, :-1]))
                else:
                    acts[0, 0, 0, 0] = np.nan
                    outputs.append(SliceOutcome(d.request_id, "ok", d.candidate_ids, acts))
            elif mode == "swapped":  # the outcomes in another order than the slices
                acts = np.stack([expected(s, sw.group.request.observations) for s in d.seeds])
                outputs.insert(0, SliceOutcome(d.request_id, "ok", d.candidate_ids, acts))
        if mode == "short" and outputs:
            outputs = outputs[:-1]
        self.log.append(f"answer {w.wid} {bid} {mode}")
        self.take(self.e.worker_result(w.identity, WorkerResult(w.wid, bid, tuple(outputs), report), self.now,
                                       plan=self.plan_now))

    def late(self) -> None:
        """A result for work answered already, or from a gone incarnation."""
        if not self.all_work:
            return
        send = self.rng.choice(self.all_work)
        w = self._worker_of(send.identity)
        if w is not None and send.batch_id in w.held:
            return
        wid = send.identity.decode().split("#")[0]
        outs = tuple(SliceOutcome(sw.dispatch.request_id, "ok", sw.dispatch.candidate_ids,
                                  np.stack([expected(s, sw.group.request.observations) for s in sw.dispatch.seeds]))
                     for sw in send.slices)
        self.log.append(f"late {send.batch_id}")
        self.take(self.e.worker_result(send.identity, WorkerResult(wid, send.batch_id, outs, {}), self.now))

    def beat(self, w: FakeWorker) -> None:
        self.take(self.e.heartbeat(w.identity, Heartbeat(w.wid, tuple(w.held)), self.now))

    def tick(self, dt: float) -> None:
        self.now += dt
        for w in self.workers.values():
            if w.alive:
                self.beat(w)
        self.take(self.e.tick(self.now))

    def cancel(self) -> None:
        r = self.rng
        if not self.sent_ids:
            return
        principal, rid, scope = r.choice(self.sent_ids)
        key = rid if scope is None else f"{scope}/{rid}"
        who = r.choice([principal, principal, ADMIN, FRONT, *CLIENTS])
        owners = self.e.tenants.owners_of(key)
        self.cancel_asked.add(key)
        answer, out = self.e.cancel(key, self.now, who)
        self.log.append(f"cancel {key} by {who.name}: {answer}")
        if owners is not None and who.role is not Role.ADMIN and who.name not in owners:  # not its group
            assert answer.error_code == "forbidden" and not out
        self.take(out)

    def react(self) -> None:
        """Workers do as they were told: register again, or say they are leaving."""
        for w in list(self.workers.values()):
            told, w.told = w.told, None
            if told == REREGISTER and w.alive and not w.leaving:
                self.log.append(f"told to register again: {w.wid}")
                self.register(w.wid)
            elif told == LEAVE and w.alive and not w.leaving:
                w.leaving = True
                self.log.append(f"told to leave: {w.wid}")
                self.take(self.e.worker_leaving(w.identity, Leaving(w.wid, 5.0), self.now))

    def step(self) -> None:
        r = self.rng
        if r.random() < 0.8:
            self.react()
        live = [w for w in self.workers.values() if w.alive]
        action = r.choices(
            ["submit", "register", "answer", "late", "tick", "cancel", "die", "leave", "lose", "give_back",
             "status", "drain", "burst", "operator_leave", "stop", "revive"],
            [10, 1.5, 14, 1, 4, 2, 0.7, 0.7, 0.5, 0.5, 1, 0.05, 1, 0.3, 0.03, 0.5])[0]
        if action == "submit":
            self.submit()
        elif action == "burst":  # a burst of messages the shell plans after once
            self.plan_now = False
            for _ in range(r.randint(2, 4)):
                held = [(w, b) for w in live for b in sorted(w.held)]
                if held and r.random() < 0.5:
                    self.answer(*r.choice(held))
                else:
                    self.submit()
            self.plan_now = True
            self.take(self.e.plan(self.now))
        elif action == "revive":  # a silent worker's link comes back: it beats and answers what it holds
            silent = [w for w in self.workers.values() if not w.alive and not w.leaving]
            if silent:
                w = r.choice(silent)
                w.alive = True
                self.log.append(f"revive {w.wid}")
                self.beat(w)
        elif action == "operator_leave" and live:
            answer, out = self.e.worker_leave(r.choice(live).wid, self.now)
            self.take(out)
        elif action == "stop" and not self.e.stopping:  # a graceful stop: the shell's flags
            self.log.append("graceful stop")
            self.e.draining = self.e.stopping = True
            self.stop = GracefulStop(self.now, r.choice([2.0, 30.0]))
        elif action == "register" or (action == "answer" and not live):
            self.register()
        elif action == "answer":
            w = r.choice(live)
            if w.held:
                self.answer(w, r.choice(sorted(w.held)))
            else:
                self.tick(0.05)
        elif action == "late":
            self.late()
        elif action == "tick":
            self.tick(r.choice([0.05, 0.3, 1.0, 4.0]))
        elif action == "cancel":
            self.cancel()
        elif action == "die" and live:
            w = r.choice(live)
            w.alive = False  # silent from now on: lost at the heartbeat timeout
            self.log.append(f"die {w.wid}")
        elif action == "leave" and live:
            w = r.choice(live)
            if not w.leaving:
                w.leaving = True
                self.log.append(f"leaving {w.wid}")
                self.take(self.e.worker_leaving(w.identity, Leaving(w.wid, 5.0), self.now))
            else:
                self.log.append(f"left {w.wid} holding {sorted(w.held)}")
                self.take(self.e.worker_left(w.identity, Left(w.wid, "done"), self.now))
                w.alive = False
        elif action == "lose" and live:
            w = r.choice(live)
            if w.held:  # its result is lost on the link: it no longer lists it
                bid = r.choice(sorted(w.held))
                self.log.append(f"lose {w.wid} {bid}")
                del w.held[bid]
        elif action == "give_back":
            leaving = [w for w in live if w.leaving and w.held]
            if leaving:
                w = r.choice(leaving)
                bids = tuple(sorted(w.held))[-1:]
                for b in bids:
                    del w.held[b]
                self.log.append(f"give back {w.wid} {bids}")
                self.take(self.e.worker_gave_back(w.identity, GiveBack(w.wid, bids), self.now))
        elif action == "status" and self.sent_ids:
            principal, rid, scope = r.choice(self.sent_ids)
            key = rid if scope is None else f"{scope}/{rid}"
            who = r.choice([principal, ADMIN, FRONT, *CLIENTS])
            answer = self.e.status(key, who)
            owners = self.owners.get(key)
            if owners is not None and who.role is not Role.ADMIN and who.name not in owners:
                # another's group, in flight or ended: nothing about it is told
                assert answer.error_code == "forbidden" or answer.state == "unknown", (key, who, answer)
        elif action == "drain":
            self.log.append("drain")
            self.e.drain()

    def settle(self) -> None:
        """Every worker alive and answering ok: everything admitted ends, and nothing is left behind."""
        if self.faults:
            self.metrics.on = False  # faults may have failed groups; none is left waiting once they stop
        if not any(w.alive and not w.leaving for w in self.workers.values()) or not self.e.workers:
            self.register("w9")
        for _ in range(2000):
            if self.stop is not None:
                verdict = self.stop.verdict(self.now, len(self.e.groups), serving_workers(self.e.workers,
                                                                                           self.e.leaving.values()))
                if verdict is not Verdict.SERVE:
                    self.log.append(f"stop: {verdict}")
                    self.take(self.e.shutdown(self.now))
                    self.stop = None
            self.react()
            if not self.e.groups and not self.e.assignments:
                break
            live = [w for w in self.workers.values() if w.alive]
            todo = [(w, b) for w in live for b in sorted(w.held)]
            if todo:
                w, b = todo[0]
                self.answer(w, b, "ok")
            else:
                self.tick(0.5)
            for w in live:
                if w.leaving and not w.held and w.wid in self.e.leaving:
                    self.take(self.e.worker_left(w.identity, Left(w.wid, "done"), self.now))
                    w.alive = False
            if not any(w.alive and not w.leaving for w in self.workers.values()) or not self.e.workers:
                self.register("w9")
        e = self.e
        assert not e.groups, f"groups never ended: {[(g.request_id, g.status.name) for g in e.groups.values()]}"
        assert not e.assignments and not e.held and not len(e.pending) and e.pending.candidates == 0
        assert not e.unstarted and not e.waiting and not e.tenants.in_flight and not e.tenants.owners
        assert e.tenants.clock.queued == 0
        owed = {c: (self.debt[c], self.got[c]) for c in self.debt if self.got[c] != self.debt[c]}
        assert not owed, f"clients not answered: {owed}"

    def run(self, steps: int) -> None:
        for _ in range(self.rng.randint(0, 2)):
            self.register()
        for _ in range(steps):
            self.step()
        if self.rng.random() < 0.15:
            self.log.append("shutdown")
            self.take(self.e.shutdown(self.now))
        self.settle()


def run_seed(seed: int, steps: int = 150, faults: float = 0.0) -> Fuzz:
    f = Fuzz(seed, faults)
    try:
        f.run(steps)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}\nlast calls:\n" + "\n".join(f.log[-25:])) from exc
    return f


@pytest.mark.parametrize("block", range(3))
def test_engine_invariants_hold_under_random_events(block):
    for seed in range(block * 35, (block + 1) * 35):
        run_seed(seed)


def test_engine_invariants_hold_when_code_inside_events_raises():
    for seed in range(1000, 1025):
        run_seed(seed, faults=0.03)

