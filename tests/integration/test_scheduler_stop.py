"""The scheduler stopped with SIGTERM, with real processes on real sockets (null workers): it admits
nothing new (`rejected` / `stopping`), serves the groups it admitted -- queued ones too -- for up to
`--stop-grace-s`, then goes; past the grace what is left is answered `shutting_down`; a second SIGTERM
stops at once (core/graceful_stop.py, service/server.py). A client that resubmits sends what a stopping
scheduler did not run to its next run (service/client.py)."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

from candidate_scheduler.bench.scrape import scrape
from candidate_scheduler.service.client import make_request
from tests.conftest import wait_for
from tests.integration.test_scheduler import IMAGE, expected_candidates

STEP_S = 0.05  # a null step
STEPS = 8  # a group of 4 candidates then takes 0.4 s on a worker of 4 rows


def load(c, n: int, prefix: str) -> list[str]:
    """n groups of 4 candidates on a worker of 4 rows: they run one after another, n x 0.4 s."""
    return [c.send(make_request(IMAGE, "pick", count=4, seed=100 + i, steps=STEPS, request_id=f"{prefix}-{i}",
                                return_candidates=True)) for i in range(n)]


def busy(c, rids: list[str]) -> None:
    """The first group running (or run) and every group read by the scheduler."""
    wait_for(lambda: c.status(rids[0]).state in ("running", "done"), 20, "the first group to run")
    wait_for(lambda: all(c.status(r).state != "unknown" for r in rids), 10, "every group read")


def fleet(services, grace: str, *, metrics: bool = False):
    """A scheduler stopping with `--stop-grace-s grace` and one null worker of 4 rows."""
    sched = services.scheduler("--stop-grace-s", grace, metrics=metrics)
    services.worker(sched, "null", 4, STEP_S)
    sched.wait_workers(1)
    return sched


def exit_code(sched, timeout_s: float) -> tuple[int, float]:
    t0 = time.monotonic()
    code = sched.proc.proc.wait(timeout=timeout_s)
    return code, time.monotonic() - t0


def test_sigterm_serves_what_was_admitted_refuses_the_rest_and_goes(services):
    sched = fleet(services, "30", metrics=True)
    with sched.client() as c:
        rids = load(c, 6, "g")
        busy(c, rids)
        sched.proc.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: scrape(sched.metrics).get("candidate_scheduler_draining") == 1.0, 5, "the draining gauge")
        late = c.submit(IMAGE, "pick", count=1, seed=7, steps=STEPS, request_id="late")
        assert (late.status, late.error_code) == ("rejected", "stopping"), late
        results = [c.wait(r, timeout_s=20) for r in rids]
        assert [r.status for r in results] == ["done"] * 6, [(r.status, r.error_code) for r in results]
        # every candidate exact: served by the stopping run as by any other
        assert all((r.candidates == expected_candidates(100 + i, 4, steps=STEPS)).all() for i, r in enumerate(results))
        code, waited = exit_code(sched, 10)
    assert code == 0
    assert waited < 5, f"it went {waited:.1f} s after its last group, not at once"
    assert sched.proc.wait_line(re.compile("every group answered"), 5)


def test_past_its_grace_what_is_left_is_answered_shutting_down(services):
    sched = fleet(services, "1.5")
    with sched.client() as c:
        rids = load(c, 12, "g")  # 4.8 s of work
        busy(c, rids)
        signalled = time.monotonic()
        sched.proc.proc.send_signal(signal.SIGTERM)
        results = [c.wait(r, timeout_s=20) for r in rids]
        code, _ = exit_code(sched, 10)
        took = time.monotonic() - signalled
    outcomes = [(r.status, r.error_code) for r in results]
    assert outcomes[0] == ("done", None), outcomes  # the one running (0.4 s of work) ended within the grace
    assert outcomes[-1] == ("failed", "shutting_down"), outcomes
    assert set(outcomes) <= {("done", None), ("failed", "shutting_down")}, outcomes
    assert code == 0 and took < 4.5, (code, took)  # the grace, not the 4.8 s of work
    assert sched.proc.wait_line(re.compile("grace ran out"), 5)


def test_a_second_sigterm_stops_at_once(services):
    sched = fleet(services, "60")
    with sched.client() as c:
        rids = load(c, 24, "g")  # 9.6 s of work
        busy(c, rids)
        sched.proc.proc.send_signal(signal.SIGTERM)
        assert sched.proc.wait_line(re.compile("stopping: serving"), 5)
        sched.proc.proc.send_signal(signal.SIGTERM)
        code, waited = exit_code(sched, 10)
        results = [c.wait(r, timeout_s=5) for r in rids]
    assert code == 0 and waited < 4.0, (code, waited)  # not the 9.6 s of work (closing lingers up to 2 s)
    assert ("failed", "shutting_down") in [(r.status, r.error_code) for r in results]


def test_with_no_worker_left_it_goes_at_once(services):
    """The fleet stopped with it (a whole-host stop): nobody will serve what it holds, so it does not wait
    out its grace."""
    sched = fleet(services, "60")
    with sched.client() as c:
        rids = load(c, 4, "g")
        busy(c, rids)
        for w in sched.workers:
            w.kill()
        wait_for(lambda: not c.stats()["workers"], 10, "the scheduler to count the worker lost")
        sched.proc.proc.send_signal(signal.SIGTERM)
        code, waited = exit_code(sched, 20)
        results = [c.wait(r, timeout_s=5) for r in rids]
    assert code == 0 and waited < 4.0, (code, waited)  # not the 60 s grace
    assert sched.proc.wait_line(re.compile("no worker left"), 5)
    assert ("failed", "shutting_down") in [(r.status, r.error_code) for r in results]


@pytest.mark.parametrize("grace", ["0", "30"])
def test_a_resubmitting_client_gets_its_group_from_the_next_run(services, grace):
    """grace 0: the group in flight is answered shutting_down; 30: the stopping run finishes it, and a
    group sent while it stops is refused stopping. Either way the client sends what was not run to the
    restarted scheduler, on the same ports, and gets it done with the same bits."""
    sched = services.scheduler("--stop-grace-s", grace)
    worker = services.worker(sched, "null", 4, STEP_S)
    sched.wait_workers(1)
    got: dict[str, object] = {}

    def submit(rid: str, seed: int) -> None:
        with sched.client(timeout_s=60) as c:
            got[rid] = c.submit(IMAGE, "pick", count=4, seed=seed, steps=STEPS, request_id=rid, resubmit=True,
                                return_candidates=True)

    with sched.client() as c:
        blockers = load(c, 3, "b")  # 1.2 s of work ahead of the group in flight
        busy(c, blockers)
        first = threading.Thread(target=submit, args=("in-flight", 11))
        first.start()
        wait_for(lambda: c.status("in-flight").state != "unknown", 10, "the group to be admitted")
        sched.proc.proc.send_signal(signal.SIGTERM)
        if grace != "0":
            assert sched.proc.wait_line(re.compile("stopping: serving"), 5)
        late = threading.Thread(target=submit, args=("late", 12))
        late.start()
        answered = [c.wait(r, timeout_s=20) for r in blockers]
    sched.proc.proc.wait(timeout=15)
    statuses = {r.status for r in answered}
    assert statuses <= {"done", "failed"} and ("failed" in statuses if grace == "0" else statuses == {"done"})
    time.sleep(0.5)  # the clients meanwhile find nobody answering; then a new run on the same ports
    restarted = services.scheduler(*sched.same_ports())
    restarted.wait_workers(1, timeout_s=30)  # the same worker process, registered again by itself
    assert worker.alive()
    first.join(60)
    late.join(60)
    for rid, seed in (("in-flight", 11), ("late", 12)):
        r = got[rid]
        assert r.status == "done", (rid, r.status, r.error_code)
        assert (r.candidates == expected_candidates(seed, 4, steps=STEPS)).all()
    # what each client was told first, and so why it sent its group again
    if grace == "0":
        assert got["in-flight"].resent == ["shutting_down"]
    else:  # the stopping run finished it; it refused the one sent while it stopped
        assert got["in-flight"].resent == [] and got["late"].resent == ["stopping"]
    with restarted.client() as c:
        # what the stopping run finished was not sent again; what it did not run was, and ran here
        ran_here = {rid for rid in ("in-flight", "late") if c.status(rid).state != "unknown"}
    assert ran_here == ({"in-flight", "late"} if grace == "0" else {"late"})


def test_the_restart_bench_runs_and_reports(tmp_path):
    """bench/scheduler_stop.py, small: the graceful arm throws nothing away, the immediate one runs again
    what was in flight (told apart by each client's first answer); every group done and exact; the report
    and plot are written."""
    from candidate_scheduler.bench import scheduler_stop

    small = {"groups": 8, "rate": 4.0, "signal_at_s": 1.1}
    runs = [scheduler_stop.run_arm(arm, **small) for arm in ("graceful", "immediate")]
    assert all(r["exact"] for r in runs), runs
    graceful, immediate = runs
    assert graceful["thrown_away"] == 0 and immediate["thrown_away"] >= 1, runs
    text = scheduler_stop.report(runs)
    assert "| graceful | 0 [0-0] |" in text
    scheduler_stop.plot(runs, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_an_async_client_resubmits_across_a_graceful_restart(services):
    """AsyncClient(..., resubmit=True) (what the openpi front uses): a group sent while the scheduler
    stops is refused stopping, waits for the next run and is done there, exact; one sent before is done
    by the stopping run."""
    import asyncio

    from candidate_scheduler.service.async_client import AsyncClient

    sched = fleet(services, "30")

    async def scenario():
        client = AsyncClient(sched.request, control=sched.control)
        try:
            def submit(rid, seed):
                return asyncio.ensure_future(client.submit(IMAGE, "pick", count=4, seed=seed, steps=STEPS, request_id=rid,
                                                           return_candidates=True, resubmit=True))
            with sched.client() as c:  # 1.2 s of work ahead, so the stop lasts while "during" is sent
                blockers = load(c, 3, "b")
                before = submit("before", 21)
                await asyncio.to_thread(busy, c, blockers)
                await asyncio.to_thread(wait_for, lambda: c.status("before").state != "unknown", 10, "it read")
            sched.proc.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(sched.proc.wait_line, re.compile("stopping: serving"), 5)
            during = submit("during", 22)
            await asyncio.to_thread(sched.proc.proc.wait, 15)
            restarted = await asyncio.to_thread(services.scheduler, *sched.same_ports())
            return await asyncio.wait_for(asyncio.gather(before, during), 60), restarted
        finally:
            client.close()

    (before, during), restarted = asyncio.run(scenario())
    for r, seed in ((before, 21), (during, 22)):
        assert r.status == "done", (r.request_id, r.status, r.error_code)
        assert (r.candidates == expected_candidates(seed, 4, steps=STEPS)).all()
    assert before.resent == [] and during.resent == ["stopping"]
    with restarted.client() as c:
        assert c.status("before").state == "unknown" and c.status("during").state == "done"
