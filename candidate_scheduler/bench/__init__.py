"""The benchmarks behind `candidate-scheduler bench` (`make bench`; results in bench/results/).

The method benchmark: N candidates four ways, side by side, plus scheduler overhead.

Methods (one run, interleaved per repeat, rotating the order so no method always runs first):

- (a) ``a_sequential``    N calls of sglang's own Cosmos3 pipeline, one per candidate seed
                          (`candidate_scheduler.worker.cosmos3.sglang_reference_actions`): the reference.
- (b) ``b_sglang_batch``  sglang's own observation batching: ONE request whose image list holds N
                          copies of the observation. All noise comes from one generator, so its
                          candidates match no candidate seed's sequential result (parity reported).
- (c) ``c_worker_batch``  our worker's batched group, in process: `adapter.run_batch` with one
                          GroupWork of N candidates.
- (d) ``d_scheduler_e2e`` end to end: a `serve` process and a `worker --adapter cosmos3` process,
                          submitted over ZMQ with `candidate_scheduler.service.client.Client`.

(a), (b) and (c) share one in-process pipeline (the adapter's hooks leave B=1 results unchanged) and
run on one dedicated compute thread, as the worker process runs its batches. Every method ends with
the served action: the `mean` reducer over its N candidates, so (d) - (c) is the scheduler's own cost
for the same work. Each group (one repeat of one N) gets a fresh observation shared by the four
methods; sglang's cross-request conditioning cache keeps the instruction's text K/V but loses its VAE
entries before each method (see `methods.Bench.fresh_conditioning`). bench/README.md explains every choice.

Also: a null-worker run (scheduler + `worker --adapter null`): admission throughput with 1,000 groups
submitted at once, end-to-end groups/s, and the pure in-process admission cost
(`admission.decide` + `GroupState.admit`).

Outputs under --out: ``bench_<device>[_smoke].json`` (every sample), ``report.md`` (tables and the
issue's targets with PASS/MISS) and PNG plots (latency vs N with p90 whiskers; speedup vs N).

The load benchmark (`--load`, `bench/load.py`): open-loop Poisson arrivals of candidate groups against
`sglang_sequential`, `dispatch` and `step` serving, each arm's capacity, and p50/p99 latency and
goodput over its capacity search and at 1.2x of it. Outputs: ``load_cpu.json``, ``load_report.md``, ``load_p99.png``.
"""
