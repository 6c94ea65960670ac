"""Staggered starts (core/stagger.py, PlanningSnapshot.starts): behind a deep backlog the workers'
batch boundaries are spread over a batch, so a group arriving behind it waits about a batch over K
for a boundary, not a whole batch."""

from __future__ import annotations

import bisect
import collections
import heapq
from functools import cached_property

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candidate_scheduler.bench.fleet_sim import ClockedFleet
from candidate_scheduler.core.access import Principal, Role
from candidate_scheduler.core.messages import Registration
from candidate_scheduler.core.snapshot import PlanningSnapshot
from candidate_scheduler.core.stagger import (
    BALANCE,
    DEEP_WAVES,
    HOLD,
    MIN_SPACING_S,
    MIXED_FLEET,
    SPREAD,
    deep,
    delay,
    mixed,
)
from tests.unit.test_engine import Harness, capability, submission

P = 100.0  # a batch, in the table's units


@pytest.mark.parametrize("taken, expected", [
    ([], 0.0),  # alone: nothing to spread from
    ([0.0], 25.0),  # a collision: a spacing past it
    ([0.0, 25.0], 50.0),  # past the run of boundaries crowded ahead
    ([0.0, 25.0, 50.0], 75.0),  # a cluster of four spreads over the whole batch in one round
    ([0.5, 25.2, 50.1], 75.0),
    ([25.0, 50.0, 75.0], 0.0),  # already spread: starts at its boundary
    ([24.0, 49.0, 74.0], 0.0),  # drift below BALANCE of a spacing is left alone
    ([99.0], 24.0),  # one ends just before it: a collision too, it moves a spacing past that one
    ([60.0, 70.0, 80.0], 20.0),  # 20 behind, 60 ahead: to the middle of the two, 20 later
])
def test_the_delay_table(taken, expected):
    assert delay(P, 4, taken) == pytest.approx(expected)


def test_the_delay_never_reaches_a_whole_batch_and_leaves_a_single_worker_alone():
    assert delay(P, 1, [0.0]) == 0.0
    assert delay(0.0, 4, [0.0]) == 0.0
    for taken in ([0.0], [0.0, 0.1, 0.2], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [5.0, 30.0, 55.0]):
        assert 0.0 <= delay(P, 8, sorted(taken)) < P


def test_a_collision_and_a_balance_are_told_apart_by_their_thresholds():
    spacing = P / 4
    assert delay(P, 4, [HOLD * spacing * 0.99, 50.0, 75.0]) > 0  # too close ahead: it jumps
    # uneven gaps on either side: it moves to the middle only when that is BALANCE of a spacing or more
    ahead, behind = 2 * BALANCE * spacing + 25.0 - 0.1, 25.0  # the middle: just under BALANCE away
    assert delay(P, 4, [ahead, 100.0 - behind]) == 0.0
    ahead += 0.2
    assert delay(P, 4, [ahead, 100.0 - behind]) == pytest.approx((ahead - behind) / 2)


def test_only_a_deep_backlog_is_staggered():
    assert deep(DEEP_WAVES * 32, 32) and not deep(DEEP_WAVES * 32 - 1, 32) and not deep(10**6, 0)


def test_a_fleet_is_mixed_when_its_batch_periods_are_further_apart_than_mixed_fleet():
    assert not mixed([0.1, 0.1 * MIXED_FLEET]) and mixed([0.1, 0.1 * MIXED_FLEET * 1.01]) and not mixed([0.3])


# ---- in the engine: a flood on four workers, with a virtual clock ------------------------------------------

LABEL = "64x64h16f5"  # SamplingSpec().forward_label()
STEP_S = 0.025  # 4 steps: a batch takes 0.1 s
DEEP = 4 * 8 * DEEP_WAVES + 64  # deep, on four workers of 8 rows, with two batches placed


def _fleet(workers: int = 4, step_s: tuple[float, ...] = (), **config) -> Harness:
    """`workers` workers of 8 rows whose steps take STEP_S (or `step_s`, worker by worker)."""
    h = Harness(**{"prefetch": 1, "prefetch_lead_s": 0.01, "max_queued_groups": 100_000, **config})
    for k in range(workers):
        wid, step = f"w{k}", step_s[k] if step_s else STEP_S
        profile = tuple((LABEL, r, step) for r in (1, 4, 8)) + ((LABEL, 0, 0.0),)
        h.take(h.engine.register(wid.encode(), Registration(wid, capability(), 8, profile=profile), h.now))
    return h


def _flood(h: Harness, groups: int, *, deadline_s: float | None = None, robots: int = 0) -> dict:
    """Run `groups` one-candidate groups of one tenant, arriving over 0.1 s in bursts as a socket delivers
    them, to the end: each worker runs one batch at a time for exactly STEP_S x 4, and the shell's
    passes at the engine's wake_at are run. Returns the start times of each worker's batches, and each
    robot group's (another tenant's, one every 0.1 s) latency."""
    events, seq = [], [0]

    def push(t, kind, payload=None):
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], kind, payload))

    t0 = h.now
    for c in range(groups // 20):
        push(t0 + c * 0.1 / (groups // 20), "burst", c)
    for r in range(robots):
        push(t0 + 0.55 + r * 0.1, "robot", r)
    free_at = {w.encode(): t0 for w in h.engine.workers}
    starts: dict[bytes, list[float]] = {w: [] for w in free_at}
    sent, woken, robot_at, latency = 0, set(), {}, {}
    while events:
        t, _, kind, payload = heapq.heappop(events)
        h.now = t
        if kind == "burst":
            for i in range(20):
                rid = f"f{payload}-{i}"
                extra = {} if deadline_s is None else {"deadline_s": deadline_s}
                h.take(h.engine.submit(("c", rid), submission(rid, count=1, seed=i, **extra), h.now, plan=False,
                                       principal=Principal("rl", "rl", Role.CLIENT)))
            h.take(h.engine.plan(h.now))
        elif kind == "robot":
            rid = f"robot{payload}"
            robot_at[rid] = t
            h.take(h.engine.submit(("r", rid), submission(rid, count=1, seed=7), h.now,
                                   principal=Principal("robots", "robots", Role.CLIENT)))
        elif kind == "result":
            h.answer(payload)
        else:
            h.take(h.engine.plan(h.now))
        for w in h.work[sent:]:
            start = max(h.now, free_at[w.identity])
            free_at[w.identity] = start + 4 * STEP_S
            starts[w.identity].append(start)
            push(start + 4 * STEP_S, "result", w)
        sent = len(h.work)
        latency.update({rid: t - at for rid, at in robot_at.items() if rid in h.replies and rid not in latency})
        wake = h.engine.wake_at
        if wake is not None and wake > h.now and wake not in woken:
            woken.add(wake)
            push(wake, "wake")
    return {"starts": starts, "latency": latency, "end": max(free_at.values()) - t0}


def _phases(starts: dict, t0: float, skip: int = 3) -> list[float]:
    """Each worker's boundary phase in the batch, from its `skip`-th batch on (they hold: one each)."""
    period = 4 * STEP_S
    out = []
    for times in starts.values():
        phases = {round(((t - t0) % period) / period, 3) % 1.0 for t in times[skip:-2]}
        assert len(phases) == 1, phases  # a worker's boundaries keep their phase while the backlog lasts
        out.append(phases.pop())
    return sorted(out)


def _spread(phases: list[float]) -> float:
    """The largest gap between neighbouring boundaries, in batches."""
    return max((b - a) % 1.0 for a, b in zip(phases, phases[1:] + [phases[0] + 1.0]))


def test_a_flood_that_lands_on_idle_workers_ends_with_their_boundaries_spread():
    h = _fleet()
    t0 = h.now
    run = _flood(h, 2000)
    assert _spread(_phases(run["starts"], t0)) == pytest.approx(0.25, abs=0.03)  # about a batch over K
    assert h.engine.stats()["stagger"]["starts"] > 0
    assert all(h.reply(f"f{c}-{i}").status == "done" for c in range(100) for i in range(20))
    # the price: a fraction of a batch of idle time per worker, once
    flat = _fleet(stagger=False)
    assert run["end"] <= _flood(flat, 2000)["end"] + 4 * STEP_S


def test_without_stagger_the_workers_stay_in_step_and_another_tenants_group_waits_longer():
    flat, spread = _fleet(stagger=False), _fleet()
    t0 = flat.now
    a, b = _flood(flat, 2000, robots=40), _flood(spread, 2000, robots=40)
    assert _spread(_phases(a["starts"], t0)) > 0.9  # every boundary at one instant of the batch
    assert max(b["latency"].values()) < max(a["latency"].values())
    assert max(b["latency"].values()) <= 4 * STEP_S * 1.3 + 0.01  # a batch, a spacing and the lead at most


def test_a_shallow_backlog_starts_every_idle_worker_at_once():
    h = _fleet()
    for i in range(4 * 8 * DEEP_WAVES - 1):  # just short of DEEP_WAVES batches of the fleet
        h.take(h.engine.submit(("c", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert sorted(w.identity for w in h.work) == [b"w0", b"w1", b"w2", b"w3"]


def test_a_deep_backlog_starts_idle_workers_one_spacing_apart_and_wakes_the_shell_for_each():
    h = _fleet()
    for i in range(DEEP):
        h.take(h.engine.submit(("c", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert [w.identity for w in h.work] == [b"w0"]
    for k in (1, 2, 3):
        assert h.engine.wake_at == pytest.approx(100.0 + k * STEP_S)  # a spacing: a batch over four workers
        assert f"w{k}" in h.engine.held_back
        h.now = 100.0 + (k - 0.7) * STEP_S  # another event before the start: the decision is kept
        h.take(h.engine.plan(h.now))
        assert h.work[-1].identity != f"w{k}".encode() and f"w{k}" in h.engine.held_back
        h.now = h.engine.wake_at
        h.take(h.engine.plan(h.now))
        assert h.work[-1].identity == f"w{k}".encode()


def test_a_deadline_at_the_head_starts_every_idle_worker_at_once():
    h = _fleet()
    for i in range(DEEP):
        h.take(h.engine.submit(("c", f"g{i}"), submission(f"g{i}", count=1, seed=i, deadline_s=60.0), h.now,
                               plan=False))
    h.take(h.engine.plan(h.now))
    assert sorted(w.identity for w in h.work) == [b"w0", b"w1", b"w2", b"w3"]


def test_a_worker_held_for_its_staggered_start_is_not_taken_for_starved():
    h = _fleet(workers=2)
    h.submit("a", count=1)
    h.submit("b", count=1)  # a shallow queue: both start at once, and end together
    first = list(h.work)
    for i in range(DEEP):  # then a flood
        h.take(h.engine.submit(("c", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    h.now = h.engine.wake_at  # the lead before they end: one is sent its next batch, the other held back
    h.take(h.engine.plan(h.now))
    assert len(h.work) == 3 and len(h.engine.held_back) == 1 and h.engine.stats()["stagger"]["starts"] == 1
    (held,) = h.engine.held_back
    h.now = 100.0 + 4 * STEP_S
    for w in first:
        h.answer(w)  # the held one is idle while work waits: on purpose, so its prefetch margin does not grow
    assert h.engine.prefetch_margin[held] == 0.0 and h.engine.wake_at == pytest.approx(h.now + 2 * STEP_S)


@pytest.mark.parametrize("batching", ["dispatch", "step"])
def test_only_dispatch_batching_staggers(batching):
    h = _fleet(batching=batching)
    for i in range(DEEP):
        h.take(h.engine.submit(("c", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    if batching == "dispatch":
        assert {w.identity for w in h.work} == {b"w0"}  # the other idle workers wait their turn
        assert h.engine.wake_at == pytest.approx(100.0 + STEP_S)
    else:  # every idle worker's free rows are filled at once
        assert {w.identity for w in h.work} == {b"w0", b"w1", b"w2", b"w3"} and not h.engine.held_back


def test_a_mixed_fleet_is_not_staggered():
    # one worker takes twice as long for a batch: one period would space none of their boundaries
    h = _fleet(step_s=(STEP_S, STEP_S, STEP_S, 2 * STEP_S))
    for i in range(DEEP):
        h.take(h.engine.submit(("c", f"g{i}"), submission(f"g{i}", count=1, seed=i), h.now, plan=False))
    h.take(h.engine.plan(h.now))
    assert sorted(w.identity for w in h.work) == [b"w0", b"w1", b"w2", b"w3"] and not h.engine.held_back


# ---- the decision in arrays is the decision one phase at a time ----------------------------------------------

def _delay_by_scan(period_s, workers, taken, balance=True):
    """core/stagger.delay as it was before it ran in arrays (a Python loop over the phases, 2026-12-03)."""
    if period_s <= 0 or workers < 2 or not taken:
        return 0.0
    spacing = period_s / workers
    ahead, behind = taken[0], period_s - taken[-1]
    if min(ahead, behind) < HOLD * spacing:
        reach = spacing
        for p in taken:
            if p < reach + HOLD * spacing:
                reach = max(reach, p + spacing)
        cap = min(period_s - spacing, reach)
        candidates = {cap, *((p + spacing) % period_s for p in taken)}
        candidates.update((a + b) / 2 for a, b in zip(taken, taken[1:]))
        within = sorted(c for c in candidates if 0.0 < c <= cap)

        def distance(d):
            i = bisect.bisect_left(taken, d)
            near = (taken[i % len(taken)], taken[i - 1])
            return min(min(abs(d - p), period_s - abs(d - p)) for p in near)
        spread = next((d for d in within if distance(d) >= SPREAD * spacing), None)
        if spread is not None:
            return spread
        return max(within, key=lambda d: (distance(d), -d), default=0.0)
    middle = (ahead - behind) / 2
    return middle if balance and middle >= BALANCE * spacing else 0.0


@st.composite
def _phases_around(draw):
    """Other workers' phases as a fleet shows them: clusters started together, runs already spread a
    spacing apart with some drift, and strays; some exactly equal, some at the circle's ends."""
    period, workers = draw(st.sampled_from([0.1, 3.0, 100.0])), draw(st.integers(2, 80))
    spacing = period / workers
    taken = []
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.floats(0.0, period, exclude_max=True))
        kind = draw(st.sampled_from(["cluster", "run", "stray"]))
        n = draw(st.integers(1, 20))
        if kind == "cluster":
            taken += [at + draw(st.floats(0.0, 0.2)) * spacing for _ in range(n)]
        elif kind == "run":
            taken += [at + k * spacing * (1 + draw(st.floats(-0.3, 0.3))) for k in range(n)]
        else:
            taken.append(at)
    taken += draw(st.lists(st.sampled_from([0.0, period * (1 - 1e-12), spacing, HOLD * spacing]), max_size=3))
    return period, workers, sorted(p % period for p in taken)


@settings(max_examples=600, deadline=None)
@given(_phases_around(), st.booleans())
def test_the_delay_in_arrays_is_the_delay_one_phase_at_a_time(case, balance):
    """Bit for bit, as a list and as a numpy array, including every jump past a crowded run."""
    period, workers, taken = case
    expected = _delay_by_scan(period, workers, taken, balance)
    assert delay(period, workers, taken, balance) == expected
    assert delay(period, workers, np.asarray(taken), balance) == expected


def _stagger_by_scan(snap, seen: collections.Counter):
    """PlanningSnapshot._stagger as it was before it read the fleet's ends from the fleet terms and
    decided in arrays: (starts, sends). Counts in `seen` the busy workers it decides for."""
    if (not snap.stagger or snap.batching != "dispatch" or len(snap.workers) < 2 or not snap.calibrated
            or not deep(snap.queue.candidates, snap.terms.total_rows)):
        return {}, {}
    head = snap.queue.walk().first()
    view = None if head is None else snap.group(head[1].request_id)
    if view is None or view.deadline is not None:
        return {}, {}
    kind = head[0]
    period, shortest, longest, live = snap.terms.periods(kind.label, kind.size, kind.cost_rows, kind.steps)
    if not live or mixed((shortest, longest)) or period / live < MIN_SPACING_S:
        return {}, {}
    spacing = period / live
    # due before any staggered start: idle, or lead_s before what it holds ends
    due = [(w.busy_until if w.running else snap.now, i, w) for i, w in enumerate(snap.workers)
           if w.rows and w.takes_a_batch and (not w.running or w.busy_until - snap.lead_s(w) <= snap.now)]
    ends = {w.worker_id: w.busy_until for w in snap.workers if w.rows and w.running}
    phases = {wid: (b - snap.now) % period for wid, b in ends.items()}
    starts, sends = {}, {}
    for boundary, _i, w in sorted(due, key=lambda d: d[:2]):
        phase = (boundary - snap.now) % period
        if w.worker_id in snap.decided:
            wait = max(0.0, snap.decided[w.worker_id] - boundary)
        else:
            others = sorted((p - phase) % period for wid, p in phases.items() if wid != w.worker_id)
            spaced = spacing >= MIN_SPACING_S + snap.prefetch_margin.get(w.worker_id, 0.0)
            wait = _delay_by_scan(period, live, others, balance=bool(w.running)) if spaced else 0.0
            seen["busy deciding"] += bool(w.running)
        phases[w.worker_id] = (phase + wait) % period
        if wait > 0:
            starts[w.worker_id] = boundary + wait
            units = max(1, w.rows // kind.size)
            before = units * snap.cost.overhead_s(w.worker_id, kind.label) if w.conditions_aside else 0.0
            sends[w.worker_id] = max(boundary, boundary + wait - before)
    return starts, sends


def test_staggered_starts_on_a_simulated_fleet_are_the_ones_a_scan_of_every_worker_decides(monkeypatch):
    """On a clocked fleet of 24 workers under the defaults, a deep backlog landing at once: at every
    decision the engine takes, the starts decided from the fleet terms' ends, in arrays, are the ones the
    scan of every worker decided -- through the first round that spreads the boundaries and the rounds
    after, idle workers and busy ones."""
    seen = collections.Counter()
    decide = PlanningSnapshot._stagger.func

    def checked(snap):
        decision = decide(snap)
        # counted, not asserted here: the engine answers what raises inside an event as an internal error
        seen["differ"] += decision != _stagger_by_scan(snap, seen)
        seen["staggered"] += bool(decision[0])
        return decision
    stagger = cached_property(checked)
    stagger.__set_name__(PlanningSnapshot, "_stagger")
    monkeypatch.setattr(PlanningSnapshot, "_stagger", stagger)
    fleet = ClockedFleet("dispatch", 24, 8, steps=20, step_s=0.15)
    fleet.submit(12 * 24 * 8, plan=False)
    fleet.plan()
    for _ in range(400):
        assert fleet.step()
    assert seen["differ"] == 0 and not fleet.engine.counters.get("internal_errors"), seen
    # starts staggered (the first round), and busy workers that decided later rounds' starts
    assert seen["staggered"] >= 20 and seen["busy deciding"] >= 100, seen
