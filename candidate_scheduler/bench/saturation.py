"""Step against dispatch batching at saturation: the rate each drains a standing queue, side by side.

The load benchmark (`--load`) finds each arm's capacity as the highest offered load whose p99 stays
within its SLO, from probes of 10-20 groups at 256x256; there the brackets of the two arms overlap and
the comparison #21 asks for (step's capacity >= dispatch's at both shapes) stays unresolved. This asks
the question the capacity is bounded by, with more groups: how fast does each arm answer when it always
has work? One `serve --batching dispatch` and one `serve --batching step`, each with its own worker, are
fed in alternating rounds (dispatch first in odd rounds, step first in even ones, so a drift of the host
falls on both), each round keeping `inflight` groups in flight until `groups` are answered. Counts cycle
1, 2, 4, 8; observations come from a pool of two that every worker has encoded before the clock starts.
Every reply must be `done`. The ratio of the rounds' rates, step over dispatch, is the figure.

    python -m candidate_scheduler.bench.saturation --side 256 --out bench/results/saturation

Not part of `make bench` (a few minutes per shape on this machine's CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

from candidate_scheduler.bench.common import git_rev, loadavg

COUNTS = (1, 2, 4, 8)
MODES = ("dispatch", "step")


def drain(endpoint: str, side: int, steps: int, inflight: int, groups: int, first: int) -> float:
    """Keep `inflight` groups in flight on `endpoint` until `groups` are answered `done`: groups per second."""
    import zmq

    from candidate_scheduler import protocol
    from candidate_scheduler.service.client import make_request, synthetic_image

    pool = [synthetic_image(side, side, seed=s) for s in (3, 4)]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        def send(n: int) -> None:
            request = make_request(pool[n % 2], "pick up the red cube", request_id=f"sat-{n}", count=COUNTS[n % 4],
                                   seed=n, reducer="mean", height=side, width=side, steps=steps)
            sock.send_multipart(protocol.encode(protocol.Kind.SUBMIT, request))

        started = time.perf_counter()
        sent = answered = 0
        while sent < min(inflight, groups):
            send(first + sent)
            sent += 1
        while answered < groups:
            if not sock.poll(300_000):
                raise RuntimeError(f"no reply within 300 s ({answered} of {groups} answered)")
            _kind, reply = protocol.decode_frames(sock.recv_multipart(), {protocol.Kind.RESULT, protocol.Kind.ERROR})
            if getattr(reply, "status", None) != "done":
                raise RuntimeError(f"a group was answered {getattr(reply, 'status', reply)!r}")
            answered += 1
            if sent < groups:
                send(first + sent)
                sent += 1
        return groups / (time.perf_counter() - started)
    finally:
        sock.close(0)


def run(side: int, *, adapter: str = "cosmos3", model: str | None = None, capacity: int = 16, steps: int = 20,
        inflight: int = 6, groups: int = 24, rounds: int = 6, progress=None) -> dict:
    """Both arms at one shape (module docstring); `progress(mode, round, groups_per_s)` after each round."""
    import tempfile

    from candidate_scheduler.service.launcher import Launcher

    started, load_before = time.perf_counter(), loadavg()
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    with Launcher(tempfile.mkdtemp(prefix="cs-saturation-"), model=model) as launcher:
        handles = {}
        for mode in MODES:
            handles[mode] = launcher.scheduler("--batching", mode, name=f"{mode}-scheduler")
            extra = ("--warmup-shapes", f"{side}x{side}") if adapter == "cosmos3" else ()
            launcher.worker(handles[mode], adapter, capacity, *extra, name=f"{mode}-worker")
        for handle in handles.values():
            handle.wait_workers(1, timeout_s=600)
        for handle in handles.values():  # the pool encoded on every worker, untimed
            drain(handle.request, side, steps, 2, 2, first=0)
        n = 2  # request ids and seeds after the warm-up's
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                rates[mode].append(drain(handles[mode].request, side, steps, inflight, groups, first=n))
                n += groups
                if progress is not None:
                    progress(mode, r, rates[mode][-1])
    ratios = [s / d for s, d in zip(rates["step"], rates["dispatch"])]
    return {
        "meta": {"created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git": git_rev(),
                 "side": side, "adapter": adapter, "capacity": capacity, "steps": steps, "inflight": inflight,
                 "groups_per_round": groups, "rounds": rounds, "counts": list(COUNTS),
                 "loadavg_start": load_before, "loadavg_end": loadavg(), "wall_s": time.perf_counter() - started},
        "groups_per_s": rates,
        "step_over_dispatch": ratios,
    }


def report(results: list[dict]) -> str:
    lines = ["# Step against dispatch at saturation", "",
             "Written by `python -m candidate_scheduler.bench.saturation` (bench/saturation.py says how). Each round "
             "keeps the stated number of groups in flight on one arm until that many are answered; the arms "
             "alternate which goes first.", "",
             "| shape | git | groups in flight | groups a round | rounds | dispatch groups/s (median, range) | "
             "step groups/s (median, range) | step / dispatch per round | median ratio |",
             "|---|---|---:|---:|---:|---|---|---|---:|"]
    for res in results:
        m, rates, ratios = res["meta"], res["groups_per_s"], res["step_over_dispatch"]

        def cell(xs: list[float]) -> str:
            return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

        lines.append(f"| {m['side']}x{m['side']} | {m['git']} | {m['inflight']} | {m['groups_per_round']} | "
                     f"{m['rounds']} | {cell(rates['dispatch'])} | {cell(rates['step'])} | "
                     f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} |")
    lines += ["", "Load average before and after each run: " + "; ".join(
        f"{r['meta']['side']}x{r['meta']['side']} {r['meta']['loadavg_start']} -> {r['meta']['loadavg_end']} "
        f"({r['meta']['wall_s']:.0f} s)" for r in results) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", type=int, action="append", help="observation side (repeat for several; default 256)")
    p.add_argument("--adapter", default="cosmos3", choices=("cosmos3", "null"))
    p.add_argument("--model", default=None, help="checkpoint directory (default: the tiny one `make` writes)")
    p.add_argument("--inflight", type=int, default=6)
    p.add_argument("--groups", type=int, default=24, help="groups answered per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="folder for saturation.json and saturation.md")
    args = p.parse_args(argv)
    model = args.model
    if model is None and args.adapter == "cosmos3":
        model = str(Path(__file__).resolve().parents[2] / ".cache" / "tiny-cosmos3")
    def progress(mode: str, r: int, rate: float) -> None:
        print(f"round {r} {mode}: {rate:.3f} groups/s", file=sys.stderr, flush=True)

    results = [run(side, adapter=args.adapter, model=model, steps=args.steps, inflight=args.inflight,
                   groups=args.groups, rounds=args.rounds, progress=progress) for side in args.side or [256]]
    text = report(results)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "saturation.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "saturation.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
