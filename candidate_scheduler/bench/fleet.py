"""`candidate-scheduler bench --fleet`: the scheduler against K emulated GPU workers, over ZMQ.

The scheduler (`serve`, metrics on, as deployed) and K null workers (`worker --adapter null
--step-delay S --capacity 8`: a denoise step is a sleep of S seconds, a stand-in for a GPU whose step
takes S whatever its rows) run as real processes; this process is the client, on one DEALER socket,
with every request encoded before the clock starts. Per fleet size and batching mode:

- `burst`: N one-candidate groups sent at once (an RL step's rollouts);
- `burst_mixed`: N/2 groups of 1, 2, 4 and 8 candidates in turn;
- `poisson`: one-candidate groups at Poisson times, at 70% of the fleet's ideal rate, for about 1.5 s;
- `burst_deadline`: N one-candidate groups, each with a deadline of twice the burst's ideal drain
  time (the deadline code runs for every group: refusal at receipt, the forecast at each send);
- `burst_elastic` (the large fleets and the smoke run): N/8 groups of 8 candidates that may shrink to 2,
  each with a deadline of 0.6x the burst's ideal drain time: in time only if about half of the
  candidates are shed, so every pass chooses counts (core/deadlines.choose_count);
- `burst_workers_niced` (a diagnostic, for the large fleets and the smoke run): `burst` again with every
  worker thread at nice 10, so that on this machine's shared cores the scheduler runs first, as it would
  beside workers on other hosts. Never a target figure.

Reported: groups/s answered `done`; utilisation = the time the workers would need if every batch were
full (candidates x steps x step time / capacity / K) over the wall time from the first send to the
last reply; p50/p99 of receipt to reply (measured by the scheduler) and of send to reply (by the
client); and whether anything was starved of CPU on this machine's 2 cores -- each process's own CPU
seconds over the wall time (the scheduler's, the workers' together, the client's) and the client's
send rate -- and how long each process class was ready to run but waited for a core (the kernel's
run-queue delay, /proc/PID/task/*/schedstat), over the wall time. Every reply is checked: one per
group, and every `done` action equal to the null model's answer for its seeds (parity), so a fast
wrong scheduler cannot pass.

The engine's own time per event against queue depth (in process, no IO) is `fleet_engine.py`; the
report puts both together (fleet_report.py).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from candidate_scheduler.bench.common import PROMPT
from candidate_scheduler.bench.fleet_report import NICED, WORKERS_NICE
from candidate_scheduler.bench.fleet_steps import decompose, steps_read, wait_for_steps
from candidate_scheduler.service.launcher import Launcher

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPACITY = 8  # rows per worker
STEPS = 4  # denoise steps per group
SIDE = 64  # observation side (pixels)
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class FleetSize:
    workers: int
    step_s: float
    burst: int

    @property
    def ideal_groups_per_s(self) -> float:
        """One-candidate groups per second with every batch full."""
        return self.workers * CAPACITY / (STEPS * self.step_s)


# K = 16 at 10 ms and K = 32 at 20 ms both have an ideal of 3,200 one-candidate groups/s (the targets).
FULL = (FleetSize(1, 0.01, 500), FleetSize(4, 0.01, 2000), FleetSize(16, 0.01, 4000), FleetSize(32, 0.02, 8000))
SMOKE = (FleetSize(1, 0.01, 60), FleetSize(4, 0.01, 120))
MODES = ("dispatch", "step")
ELASTIC_COUNT, ELASTIC_MIN = 8, 2  # burst_elastic's groups


@dataclass(frozen=True)
class Workload:
    name: str
    counts: tuple[int, ...]
    groups: int
    rate: float | None = None  # Poisson arrivals per second; None: all at once
    deadline_s: float | None = None
    workers_nice: int = 0  # the workers' threads run at this nice value meanwhile (0: as started)
    min_count: int | None = None  # with a deadline: elastic counts, n in [min_count, count]


def workloads(size: FleetSize, smoke: bool) -> list[Workload]:
    """Every workload for the fleets the targets are about (K >= 16) and the smoke run; the bursts alone
    for the small fleets of the full run (make bench keeps under 15 minutes)."""
    drain_s = size.burst / size.ideal_groups_per_s
    out = [Workload("burst", (1,), size.burst)]
    if smoke or size.workers >= 16:
        out.append(Workload("burst_mixed", (1, 2, 4, 8), size.burst // 2))
        rate = 0.7 * size.ideal_groups_per_s
        out.append(Workload("poisson", (1,), max(20, int(rate * (0.5 if smoke else 1.5))), rate=rate))
    out.append(Workload("burst_deadline", (1,), size.burst, deadline_s=max(1.0, 2 * drain_s)))
    if smoke or size.workers >= 16:
        # as many rows as `burst`, in groups of 8 that may shrink to 2: in time only if about half of them do
        out.append(Workload("burst_elastic", (ELASTIC_COUNT,), size.burst // ELASTIC_COUNT,
                            deadline_s=max(1.0, 0.6 * drain_s), min_count=ELASTIC_MIN))
    if smoke or size.workers >= 16:
        out.append(Workload(NICED, (1,), size.burst, workers_nice=WORKERS_NICE))
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds of a live process: its threads' run time from /proc/PID/task/*/schedstat, in
    nanoseconds -- a short run of sleeping null workers spends less than the 10 ms clock tick that
    /proc/PID/stat counts in, and would show none -- else user + system from /proc/PID/stat. A thread
    that ends takes its run time out of this sum: a run's figure is `run_times` taken thread by thread."""
    total, found = 0, False
    for tid in _tasks(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
            found = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile, or no schedstat here
            continue
    if found:
        return total / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def run_times(pids: list[int]) -> dict[tuple[int, str], int]:
    """Nanoseconds each live thread of these processes has run, from /proc/PID/task/TID/schedstat (else
    user + system from /proc/PID/task/TID/stat, in clock ticks). Per thread, not per process: the
    scheduler's metrics server answers each scrape on a thread of its own, and one that ran before a
    run and ended in it would take its run time off the run's figure (per_thread_s)."""
    out = {}
    for pid, tid in _threads(pids):
        ran = _schedstat(pid, tid, 0)
        if ran is None:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ran = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _TICK
            except (OSError, IndexError, ValueError):
                continue
        out[pid, tid] = ran
    return out


def waits(pids: list[int]) -> dict[tuple[int, str], int]:
    """Nanoseconds each live thread of these processes was ready to run but waited for a core (the
    run-queue delay, from /proc/PID/task/TID/schedstat: run time, wait time, timeslices)."""
    found = {(pid, tid): _schedstat(pid, tid, 1) for pid, tid in _threads(pids)}
    return {key: ns for key, ns in found.items() if ns is not None}


def _threads(pids: list[int]) -> list[tuple[int, str]]:
    return [(pid, tid) for pid in pids for tid in _tasks(pid)]


def _schedstat(pid: int, tid: str, field: int) -> int | None:
    """One field of the thread's schedstat (0: run time, 1: run-queue wait, in ns); None when it ended
    meanwhile, or the kernel keeps no schedstat."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[field])
    except (OSError, IndexError, ValueError):
        return None


def per_thread_s(before: dict, after: dict) -> float:
    """Seconds between two per-thread snapshots (`run_times`, `waits`), thread by thread: a thread that
    ended meanwhile drops out (what it counted before must not be taken off the total), one that started
    counts in full."""
    return sum(ns - before.get(key, 0) for key, ns in after.items()) / 1e9


waited_s = per_thread_s  # seconds waited for a core between two `waits` snapshots


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def can_renice_back() -> bool:
    """Whether this process may lower a nice value back to 0 once it raised it: root, or an RLIMIT_NICE
    of 20 or more (anyone may raise a nice value, so that alone says nothing)."""
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def renice(pids: list[int], nice: int) -> bool:
    """Every thread of these processes at `nice` (Linux: a nice value is per thread); False when a thread
    refused it."""
    ok = True
    for pid in pids:
        for tid in _tasks(pid):
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
            except PermissionError:
                ok = False
    return ok


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def _base_seed(index: int) -> int:
    """The base seed of a workload's group `index` (the check derives its candidates' seeds from it)."""
    return 1000 + index


def _requests(workload: Workload, tag: str) -> tuple[list, list[int], np.ndarray]:
    from candidate_scheduler import protocol
    from candidate_scheduler.service.client import make_request, synthetic_image

    image = synthetic_image(SIDE, SIDE, seed=11)
    frames, counts = [], []
    for i in range(workload.groups):
        count = workload.counts[i % len(workload.counts)]
        counts.append(count)
        req = make_request(image, PROMPT, request_id=f"{tag}-{i}", count=count, seed=_base_seed(i), reducer="mean",
                           deadline_s=workload.deadline_s, height=SIDE, width=SIDE, steps=STEPS,
                           min_count=workload.min_count)
        frames.append(protocol.encode(protocol.Kind.SUBMIT, req))
    return frames, counts, image


def drive(endpoint: str, frames: list, send_at: list[float] | None, timeout_s: float) -> dict:
    """Send every request (at its time, or at once) on one DEALER socket while reading replies; returns
    the timings and every reply, by request index."""
    import zmq

    from candidate_scheduler import protocol

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    for opt, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)):
        sock.setsockopt(opt, value)
    sock.connect(endpoint)
    allowed = {protocol.Kind.RESULT, protocol.Kind.ERROR, protocol.Kind.PONG}
    sock.send_multipart(protocol.encode(protocol.Kind.PING, protocol.Ping(1)))
    if not sock.poll(10_000):
        raise TimeoutError("the scheduler did not answer a PING")
    sock.recv_multipart()
    n = len(frames)
    sent = [0.0] * n
    got: dict[int, tuple[float, object]] = {}
    t0 = time.perf_counter()
    i = 0
    last_sent = t0
    try:
        while len(got) < n:
            now = time.perf_counter()
            if now - t0 > timeout_s:
                raise TimeoutError(f"{len(got)}/{n} replies after {timeout_s:.0f} s")
            # send what is due, a chunk at a time so replies are read meanwhile
            chunk = 0
            while i < n and chunk < 256 and (send_at is None or send_at[i] <= now - t0):
                sock.send_multipart(frames[i], copy=False)
                sent[i] = time.perf_counter()
                last_sent = sent[i]
                i += 1
                chunk += 1
            if i < n and send_at is None:
                wait_ms = 0
            elif i < n:
                wait_ms = max(0, int((send_at[i] - (time.perf_counter() - t0)) * 1000))
            else:
                wait_ms = 1000
            if sock.poll(wait_ms):
                while True:
                    try:
                        msg = sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    at = time.perf_counter()
                    kind, body = protocol.decode_frames(msg, allowed)
                    if kind is protocol.Kind.RESULT:
                        index = int(body.request_id.rsplit("-", 1)[1])
                        if index in got:
                            raise AssertionError(f"two replies for {body.request_id}")
                        got[index] = (at, body)
                    elif kind is protocol.Kind.ERROR:
                        raise RuntimeError(f"{body.error_code}: {body.error}")
    finally:
        sock.close(0)
    return {"t0": t0, "sent": sent, "last_sent": last_sent, "replies": got}


def null_model_action(image: np.ndarray, seeds: list[int], steps: int = STEPS, side: int = SIDE) -> np.ndarray:
    """The reduced ("mean") action the null model answers for these candidate seeds: [1, H, D]."""
    from candidate_scheduler.core import reducers
    from candidate_scheduler.core.work import SamplingSpec
    from candidate_scheduler.worker.null_adapter import NullAdapter

    sampling = SamplingSpec(height=side, width=side, steps=steps)
    mean = float(np.asarray(image, dtype=np.float64).mean())
    stacked = np.stack([NullAdapter.expected(s, mean, sampling)[None] for s in seeds])
    return reducers.reduce("mean", stacked)[0]


def check(workload: Workload, counts: list[int], image: np.ndarray, replies: dict) -> dict:
    """One reply per group; every `done` action is the null model's answer for its seeds, which are its
    first n candidates' (n its count, or in [min_count, count] when elastic)."""
    from candidate_scheduler import protocol
    from candidate_scheduler.core.spec import CandidateTrajectorySpec

    statuses: dict[str, int] = {}
    wrong = 0
    served = []
    for index in range(workload.groups):
        _at, r = replies[index]
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if r.status != "done":
            continue
        seeds = list(r.candidate_seeds)
        least = counts[index] if workload.min_count is None else workload.min_count
        first = list(CandidateTrajectorySpec(count=counts[index]).candidate_seeds(_base_seed(index))[:len(seeds)])
        served.append(len(seeds))
        if not least <= len(seeds) <= counts[index] or seeds != first or not np.array_equal(
                protocol.array_from_wire(r.action), null_model_action(image, seeds)):
            wrong += 1
    return {"statuses": statuses, "wrong_results": wrong, "replies": len(replies), "groups": workload.groups,
            "served_mean": float(np.mean(served)) if served else None}


def run_workload(handle, size: FleetSize, workload: Workload, tag: str, seed: int) -> dict:
    frames, counts, image = _requests(workload, tag)
    send_at = None
    if workload.rate is not None:
        from candidate_scheduler.bench.open_loop import poisson_schedule

        send_at = poisson_schedule(workload.rate, workload.groups / workload.rate, seed)
    pids = {"scheduler": [handle.proc.pid], "workers": [w.pid for w in handle.workers], "client": [os.getpid()]}
    if workload.workers_nice and not can_renice_back():
        return {"workload": asdict(workload), "skipped": "renice back to 0 not permitted (needs root or RLIMIT_NICE)"}
    if workload.workers_nice and not renice(pids["workers"], workload.workers_nice):
        renice(pids["workers"], 0)
        return {"workload": asdict(workload), "skipped": "renice not permitted"}
    try:
        steps_before = steps_read(handle.metrics)
        before = {k: run_times(v) for k, v in pids.items() if k != "client"}
        waited_before = {k: waits(v) for k, v in pids.items()}
        client_before = resource.getrusage(resource.RUSAGE_SELF)
        busy_before = machine_busy()
        run = drive(handle.request, frames, send_at, timeout_s=120 + 10 * workload.groups / size.ideal_groups_per_s)
        busy_after = machine_busy()
        client_after = resource.getrusage(resource.RUSAGE_SELF)
        after = {k: run_times(v) for k, v in pids.items() if k != "client"}
        waited_after = {k: waits(v) for k, v in pids.items()}
    finally:
        if workload.workers_nice and not renice(pids["workers"], 0):
            print("fleet bench: could not renice the workers back to 0", file=sys.stderr)
    replies = run["replies"]
    wall = max(at for at, _r in replies.values()) - run["t0"]
    done = [i for i, (_at, r) in replies.items() if r.status == "done"]
    # the candidates served (an elastic group's may be fewer than it asked for)
    row_steps = sum(len(replies[i][1].candidate_seeds) for i in done) * STEPS
    ideal = row_steps * size.step_s / CAPACITY / size.workers
    # after the CPU figures above: the workers' last step records come with their next heartbeats
    steps_after = wait_for_steps(handle.metrics, steps_before, row_steps, settle=len(done) < len(replies))
    steps = decompose(steps_before, steps_after, row_steps=row_steps, capacity=CAPACITY, step_s=size.step_s,
                      workers=size.workers, wall_s=wall)
    receipt = [float(r.metrics["receipt_to_reply_s"]) for _at, r in replies.values() if "receipt_to_reply_s" in r.metrics]
    client_lat = [at - run["sent"][i] for i, (at, _r) in replies.items()]
    cores = {k: per_thread_s(before[k], after[k]) / wall for k in after}
    cores["client"] = (client_after.ru_utime + client_after.ru_stime - client_before.ru_utime
                       - client_before.ru_stime) / wall
    d_busy, d_total = busy_after[0] - busy_before[0], busy_after[1] - busy_before[1]
    send_s = run["last_sent"] - run["t0"]
    return {
        "workload": asdict(workload),
        "wall_s": wall,
        "groups_per_s": len(done) / wall,
        "ideal_groups_per_s": size.ideal_groups_per_s,
        "utilisation": ideal / wall,
        "receipt_to_reply_ms": _percentiles(receipt),
        "client_latency_ms": _percentiles(client_lat),
        "client_send_s": send_s,
        "client_send_per_s": workload.groups / send_s if send_s > 0 else None,
        "cores": cores,  # CPU seconds per wall second of each process class
        # seconds ready to run but waiting for a core, per wall second, of each process class (all its threads)
        "waited": {k: waited_s(waited_before[k], waited_after[k]) / wall for k in waited_after},
        "machine_busy": d_busy / d_total if d_total else None,  # of all cores together (1.0 = every core busy)
        "steps": steps,  # the utilisation's factors, from the workers' own step records (bench/fleet_steps.py)
        "check": check(workload, counts, image, replies),
    }


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    arr = np.asarray(values) * 1e3
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)), "max": float(arr.max())}


def run_fleet(smoke: bool, progress=None) -> dict:
    """Every fleet size x batching mode x workload (SMOKE: two small fleets); the raw figures."""
    sizes = SMOKE if smoke else FULL
    runs, skipped = [], []
    log_dir = tempfile.mkdtemp(prefix="cs-fleet-")
    for size in sizes:
        for mode in MODES:
            with Launcher(log_dir) as launcher:
                handle = launcher.scheduler("--batching", mode, "--max-queued-groups", "50000", metrics=True,
                                            name=f"scheduler-{mode}-{size.workers}")
                for _ in range(size.workers):
                    launcher.worker(handle, "null", CAPACITY, step_delay=size.step_s)
                handle.wait_workers(size.workers, timeout_s=300)
                for k, workload in enumerate(workloads(size, smoke)):
                    tag = f"{mode}{size.workers}{workload.name}"
                    result = run_workload(handle, size, workload, tag, seed=k)
                    result.update(workers=size.workers, step_s=size.step_s, batching=mode)
                    (skipped if "skipped" in result else runs).append(result)
                    if progress is not None:
                        progress(result)
    return {"runs": runs, "skipped": skipped, "capacity": CAPACITY, "steps": STEPS, "side": SIDE, "log_dir": log_dir}


def run_fleet_bench(out_dir, *, smoke: bool = False, plot: bool = True, baseline: str | None = None,
                    baseline_events: int | None = None) -> dict:
    """`bench --fleet`: the engine in process against queue depth, then the fleet over ZMQ; writes
    fleet.json (fleet_smoke.json with --smoke), the report and the plots. With `baseline` (a git
    revision) instead: only the engine in process, each point against that revision's engine and this
    one side by side, written to fleet_baseline.json / .md / .png (a plain run never touches them)."""
    if baseline is not None:
        return run_baseline(out_dir, baseline, plot=plot, events=baseline_events)
    import datetime
    from pathlib import Path

    from tqdm import tqdm

    from candidate_scheduler.bench import engine_spacing, fleet_engine, fleet_report, fleet_sim
    from candidate_scheduler.bench.common import git_rev, loadavg

    started, load_before = time.perf_counter(), loadavg()
    depths = (100, 1000) if smoke else (100, 1000, 5000, 10_000)
    deadline_depths = (100, 1000) if smoke else (100, 10_000)
    events = 60 if smoke else 150
    sizes = SMOKE if smoke else FULL
    fleet_sizes = fleet_engine.SIZES[:2] if smoke else fleet_engine.SIZES
    # the simulated fleets at the ends of the range only: a step point's window is 8x the results (one
    # group each), and make bench keeps under 15 minutes (--fleet-baseline runs every size)
    sim_sizes = fleet_sizes[:2] if smoke else (fleet_sizes[0], fleet_sizes[-1])
    total = (2 * (len(depths) + 2 * len(deadline_depths) + len(fleet_sizes) + len(sim_sizes)) + 1
             + sum(len(workloads(s, smoke)) for s in sizes) * len(MODES))
    progress = tqdm(total=total, desc="fleet: engine in process", unit="run", file=sys.stderr, dynamic_ncols=True,
                    mininterval=0.5)
    try:
        engine = fleet_engine.sweep(depths, events=events, progress=lambda _r: progress.update(1))
        # every group with a deadline: refusal at receipt, and the forecast at each send
        deadline = fleet_engine.sweep(deadline_depths, events=events, deadline_every=1,
                                      progress=lambda _r: progress.update(1))
        # elastic groups with deadlines: their counts chosen at every pass (core/deadlines.choose_count)
        elastic = fleet_engine.sweep(deadline_depths, events=events, elastic=True,
                                     progress=lambda _r: progress.update(1))
        # against the fleet's size: a refusal check per submission, a planning pass per event
        by_size = fleet_engine.sweep_sizes(fleet_sizes, events=events, progress=lambda _r: progress.update(1))
        # again under the scheduler's defaults (late prefetch, staggered starts), on a simulated clock;
        # fewer results a point than --fleet-baseline's 1,500: make bench keeps under 15 minutes
        defaults = fleet_sim.sweep(sim_sizes, results=300 if smoke else 800, warmup=100 if smoke else 200,
                                   progress=lambda _r: progress.update(1))
        # one group at a time, spaced apart: what a group costs when groups do not come in bursts
        spacing = engine_spacing.sweep((0.0, 0.01) if smoke else engine_spacing.SPACINGS_S,
                                       groups=30 if smoke else 100, warmup=50 if smoke else 200)
        progress.update(1)
        progress.set_description("fleet: scheduler + null workers over ZMQ")

        def step(run: dict) -> None:
            progress.set_description(f"fleet: K={run['workers']} {run['batching']} {run['workload']['name']}")
            progress.update(1)

        fleet = run_fleet(smoke, step)
    finally:
        progress.close()
    meta = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": git_rev(), "smoke": smoke, "cpu_count": os.cpu_count(),
        "engine_workers": engine[0]["workers"], "engine_rows": engine[0]["rows"],
        "loadavg_start": load_before, "loadavg_end": loadavg(), "wall_s": time.perf_counter() - started,
    }
    result = {"meta": meta, "engine": engine, "engine_deadlines": deadline, "engine_elastic": elastic,
              "engine_sizes": by_size, "engine_defaults": defaults, "engine_spacing": spacing, "fleet": fleet}
    out = Path(out_dir)
    if smoke:
        out = out / "fleet_smoke"
    files = fleet_report.write_outputs(result, out, plot=plot)
    print(f"fleet bench: {meta['wall_s']:.0f} s; wrote {files['json']}, {files['report']}"
          + (f", {len(files['plots'])} plots" if files["plots"] else ""))
    return result


def run_baseline(out_dir, revision: str, *, plot: bool = True, events: int | None = None) -> dict:
    """The engine in process, `revision`'s and this one's, point by point (see run_fleet_bench); with
    `events`, that many at every point for both (else 300, fewer for `revision` at deep queues)."""
    import datetime
    from pathlib import Path

    from tqdm import tqdm

    from candidate_scheduler.bench import fleet_engine, fleet_report, fleet_sim
    from candidate_scheduler.bench.common import git_rev, loadavg

    started, load_before = time.perf_counter(), loadavg()
    depths, deadline_depths = (100, 1000, 5000, 10_000), (100, 10_000)
    elastic_depths = (100, 1000)  # an engine that sums elastic groups one by one takes seconds an event at 1,000
    progress = tqdm(total=4 * (len(depths) + len(deadline_depths) + len(elastic_depths) + len(fleet_engine.SIZES)
                               + len(fleet_sim.SIZES)),
                    desc=f"fleet: engine, {revision} and this revision",
                    unit="run", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    root = _worktree(revision)
    try:
        rows = fleet_engine.sweep(depths, events=events or 300, baseline=root, same_events=events is not None,
                                  progress=lambda _r: progress.update(1))
        # every group with a deadline: refusal at receipt, and the forecast at each send
        deadline = fleet_engine.sweep(deadline_depths, events=events or 300, deadline_every=1, baseline=root,
                                      same_events=events is not None, progress=lambda _r: progress.update(1))
        elastic = fleet_engine.sweep(elastic_depths, events=events or 300, elastic=True, baseline=root,
                                     same_events=events is not None, progress=lambda _r: progress.update(1))
        by_size = fleet_engine.sweep_sizes(events=events or 300, baseline=root, progress=lambda _r: progress.update(1))
        defaults = fleet_sim.sweep(baseline=root, progress=lambda _r: progress.update(1))
    finally:
        progress.close()
        subprocess.run(["git", "worktree", "remove", "--force", root], cwd=_ROOT, capture_output=True)
    meta = {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git": git_rev(),
            "baseline": _rev(revision), "cpu_count": os.cpu_count(), "engine_workers": rows[0]["workers"],
            "engine_rows": rows[0]["rows"], "loadavg_start": load_before, "loadavg_end": loadavg(),
            "wall_s": time.perf_counter() - started, "same_events": events is not None}
    result = {"meta": meta, "engine": rows, "engine_deadlines": deadline, "engine_elastic": elastic,
              "engine_sizes": by_size, "engine_defaults": defaults}
    files = fleet_report.write_baseline(result, Path(out_dir), plot=plot)
    print(f"fleet baseline: {meta['wall_s']:.0f} s; wrote {files['json']}, {files['report']}")
    return result


def _rev(revision: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", revision], cwd=_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _worktree(revision: str) -> str:
    """A checkout of `revision` in a temporary folder (removed after the run)."""
    path = tempfile.mkdtemp(prefix="cs-baseline-")
    os.rmdir(path)
    subprocess.run(["git", "worktree", "add", "--detach", path, revision], cwd=_ROOT, capture_output=True, check=True)
    return path

