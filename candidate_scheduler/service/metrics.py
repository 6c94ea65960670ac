"""Every Prometheus metric of the service, in one place.

The scheduler process exports everything on one /metrics port. Workers do not run their own exporter:
they send per-batch timings (conditioning encode, denoise, action postprocess) back to the scheduler
with each batch result over the worker link, and the scheduler records them here. One scrape target
then sees the whole service, and a worker that dies mid-batch cannot take its last numbers with it.

Naming follows Prometheus practice: one prefix, base units (seconds), `_total` counters, histograms
rather than summaries (they aggregate across restarts and replicas), no ids as labels. Every label
takes its value from a closed tuple below; anything else is recorded as "other", so a bug or a hostile
client cannot blow up cardinality. The pure rooms (admission, group_state) own the meaning of these
values; the unit tests check that their sets stay inside ours.
"""

from __future__ import annotations

import enum
import itertools
import math
import platform
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from candidate_scheduler import __version__
from candidate_scheduler.service.metric_values import Counter, Gauge, Histogram

PREFIX = "candidate_scheduler_"

# Loopback by default: /metrics is unauthenticated. 9464 is the port OpenTelemetry's Prometheus
# exporter conventionally uses, so it is unlikely to collide with sglang's HTTP port.
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 9464

OTHER = "other"

# --- Closed label sets ("other" is always allowed and catches everything unknown) ---------------------
APIS = ("native", "compat", "openpi", OTHER)
# done/failed/cancelled/expired are group_state's terminal reasons; rejected/overloaded/invalid are
# answers given before a group ever gets a GroupState (admission reject, full queue, undecodable spec).
OUTCOMES = ("done", "failed", "cancelled", "expired", "rejected", "overloaded", "invalid", OTHER)
ADMISSION_MODES = ("atomic", "microbatch", "sequential", "rejected", OTHER)
ADMITTED_MODES = ("atomic", "microbatch", "sequential", OTHER)
ADMISSION_REASONS = (
    "fits",
    "over_capacity",
    "does_not_fit",
    "unknown_reducer",
    "count_over_limit",
    "unsupported_action_mode",
    "bad_request",
    OTHER,
)
# "done" means the cancel found the group already finished (any terminal state); "unknown" means no
# such group (never existed, or already forgotten).
CANCEL_STATES = ("queued", "admitted", "running", "reducing", "done", "unknown", OTHER)
_FINISHED_STATES = frozenset({"done", "failed", "cancelled", "expired"})
# reregistered: a worker registered again under its id (it restarted), so its old work is lost.
RETRY_REASONS = ("worker_died", "heartbeat_timeout", "worker_error", "reregistered", "out_of_memory",
                 "left_unfinished", OTHER)
WORKER_FAILURE_KINDS = ("worker_died", "heartbeat_timeout", "worker_error", "reregistered", "left_unfinished", OTHER)
DEPARTURES = ("finished", "unfinished", OTHER)
SOCKETS = ("request", "control", "worker", "compat", OTHER)
PROTOCOL_ERROR_KINDS = (
    "bad_frames",
    "bad_msgpack",
    "bad_type",
    "oversize",
    "pickle_refused",
    "unknown_kind",
    "version",
    # the compat bridge's own refusals, reported in its COMPAT_REPORT (compat/bridge.py): too many
    # requests in flight, and the scheduler not answering it
    "busy",
    "scheduler_unavailable",
    OTHER,
)
# the engine's events (core/engine.py), plus the shell's own loop: where code raised
EVENTS = ("submit", "register", "heartbeat", "result", "leaving", "left", "give_back", "tick", "cancel",
          "worker_leave", "shutdown", "schedule", "reply", "shell", OTHER)
# the tenants named in the key directory (core/access.py): set per instance, see SchedulerMetrics
CONFIGURED_TENANTS = ("<configured tenants>",)
RESUBMISSIONS = ("in_flight", "answered", OTHER)
ACTIONS = ("submit", "cancel", "status", "stats", "drain", "shutdown", "compat_report", "worker_leave", OTHER)
COMPAT_REQUEST_TYPES = ("req", "req_list", "ping", "shutdown", "warmup", "control", "unknown", OTHER)
# the fronts `serve` runs as child processes and starts again when they exit (service/front_watch.py), by
# the client API each serves (the sglang compat bridge: "compat"), as groups_received_total names them
FRONT_APIS = ("compat", "openpi", OTHER)

# --- Buckets -------------------------------------------------------------------------------------------
# 1 ms (a cached CPU reducer) to 60 s (a long denoise on a busy GPU); roughly 1-2.5-5 per decade.
SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
)
# A group's waits run on to an hour: an RL step's thousands of groups queue for minutes, and with the
# last edge at 60 s every quantile of such a backlog read "over a minute".
WAIT_SECONDS_BUCKETS = (*SECONDS_BUCKETS, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Powers of two: candidate counts and batch capacities are usually powers of two, so a bucket edge
# lands exactly on the common values (le is inclusive).
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MICROBATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256)
CACHE_KINDS = ("text", "vae")
CACHE_RESULTS = ("hit", "miss")
# actual / predicted: 1 is a perfect forecast; a decade either side
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)
# forward latency is labelled by rows rounded up to a power of two: a closed set of 10 series
ROW_LABELS = ("1", "2", "4", "8", "16", "32", "64", "128", "256", OTHER)
OCCUPANCY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def clip_label(value: object, allowed: Iterable[str]) -> str:
    """The label value for `value`, or "other" when it is outside the closed set.

    Accepts plain strings and enums: a str-valued enum by its value (AdmissionMode.ATOMIC -> "atomic"),
    an int enum by its lower-cased name (GroupStatus.RUNNING -> "running").
    """
    if isinstance(value, enum.Enum):
        value = value.value if isinstance(value.value, str) else value.name.lower()
    text = str(value)
    return text if text in allowed else OTHER


def row_label(rows: int) -> str:
    bucket = 1
    while bucket < rows and bucket < 256:
        bucket *= 2
    return str(bucket) if 0 < rows <= 256 else OTHER


def _define(kind: type, name: str, documentation: str, buckets: tuple[float, ...] | None = None, /,
            **labels: tuple[str, ...]) -> tuple:
    # positional-only: "kind" is a label name too
    return kind, name, documentation, buckets, labels


# Every metric but build_info: its type, its name without the prefix (also its attribute on
# SchedulerMetrics; counters keep `_total`), its help, a histogram's buckets, and each label with its
# closed set of values.
METRICS = (
    # Groups through their life.
    _define(Counter, "groups_received_total", "Submissions received, by client API: resubmissions of a group in flight "
            "or answered included (resubmissions_total counts those; each group is completed once).", api=APIS),
    _define(Counter, "groups_admitted_total", "Candidate groups admitted, by admission mode.", mode=ADMITTED_MODES),
    _define(Counter, "groups_completed_total", "Candidate groups answered, by outcome.", outcome=OUTCOMES),
    _define(Counter, "admission_decisions_total", "Admission decisions, by mode and reason.",
            mode=ADMISSION_MODES, reason=ADMISSION_REASONS),
    _define(Histogram, "group_candidates", "Candidates requested per well-formed group.", COUNT_BUCKETS),
    _define(Histogram, "group_microbatches", "Physical slices an admitted group was split into (1 = atomic).",
            MICROBATCH_BUCKETS),
    _define(Histogram, "group_latency_seconds", "Receipt to answer, per group, by outcome.", WAIT_SECONDS_BUCKETS,
            outcome=OUTCOMES),
    # Queue.
    _define(Gauge, "queued_groups", "Groups admitted or waiting for a worker, none of whose slices has started yet "
            "(a group running on a worker is not queued)."),
    _define(Gauge, "queued_candidates", "Candidates in slices not yet dispatched, and of groups waiting for a "
            "first worker (queued_groups counts those too)."),
    _define(Histogram, "queue_wait_seconds", "Receipt to first dispatch, per group.", WAIT_SECONDS_BUCKETS),
    # Physical batches: counted at dispatch; stage timings arrive with the worker's result.
    _define(Counter, "physical_batches_total", "Physical batches dispatched to workers."),
    _define(Gauge, "prefetch_margin_max_seconds",
            "The largest extra lead late prefetch has learned a worker needs (core/prefetch.py); it grows when "
            "batches end with nothing to start."),
    _define(Gauge, "forecast_margin",
            "The fleet's forecast margin: the --deadline-margin-quantile of actual / predicted time over every "
            "worker's recent assignments (core/margins.py); what a worker with too few of its own plans with."),
    _define(Gauge, "forecast_margin_max",
            "The largest forecast margin a worker plans with: one running late on its forecasts (a slower "
            "device, a busy host, a warm-up profile that overstates its speed) shows here."),
    _define(Counter, "staggered_starts_total",
            "Workers held past their batch boundary behind a deep backlog, so boundaries spread (core/stagger.py)."),
    _define(Counter, "transformer_forwards_total",
            "Transformer forward passes in the workers' batch results, one per denoise step per assignment: a "
            "forward shared by n assignments of a running batch counts n times (each forward run once: "
            "forward_rows_count)."),
    _define(Histogram, "batch_rows", "Candidate rows per physical batch.", COUNT_BUCKETS),
    _define(Histogram, "batch_occupancy_ratio", "Candidate rows per physical batch over worker capacity.",
            OCCUPANCY_BUCKETS),
    _define(Histogram, "conditioning_encode_seconds", "Conditioning encode time per physical batch.", SECONDS_BUCKETS),
    _define(Histogram, "denoise_seconds", "Denoise loop time per physical batch.", SECONDS_BUCKETS),
    _define(Histogram, "action_postprocess_seconds", "Action postprocess time per physical batch.", SECONDS_BUCKETS),
    _define(Histogram, "reducer_seconds", "Reducer time per group (all partial updates plus finalize).",
            SECONDS_BUCKETS),
    # Step-level batching: groups joining running batches, time to first step, forwards by rows.
    _define(Counter, "groups_joined_total", "Slices that joined a worker's running batch at a step boundary."),
    _define(Histogram, "first_step_seconds", "Receipt to the group's first denoise step, per group.",
            WAIT_SECONDS_BUCKETS),
    _define(Histogram, "forward_rows", "Candidate rows per denoise step of a worker's running batch (one "
            "transformer forward, in calls of at most the worker's --call-rows), as workers report them.",
            COUNT_BUCKETS),
    _define(Histogram, "forward_seconds", "Denoise step latency of a worker's running batch, by its rows (a "
            "power-of-two bucket).", SECONDS_BUCKETS, rows=ROW_LABELS),
    # Deadlines, the cost model and elastic counts.
    _define(Counter, "deadline_refusals_total", "Groups refused at receipt: their deadline was predicted to be missed."),
    _define(Counter, "deadline_misses_total",
            "Groups with a deadline not answered done within it (expired, or done late)."),
    _define(Counter, "requested_candidates_total", "Candidates requested by groups answered done."),
    _define(Counter, "served_candidates_total", "Candidates served by groups answered done (fewer than requested under an elastic count)."),
    _define(Histogram, "served_count_ratio", "Served count over requested count, per group answered done.",
            OCCUPANCY_BUCKETS),
    _define(Histogram, "prediction_ratio", "Actual over predicted time of each assignment (the cost model's error).",
            RATIO_BUCKETS),
    # Conditioning reuse across groups (the workers' caches, reported in heartbeats).
    _define(Counter, "conditioning_cache_lookups_total",
            "Worker conditioning-cache lookups, by kind (text K/V, VAE latent) and result (hit, miss).",
            kind=CACHE_KINDS, result=CACHE_RESULTS),
    _define(Counter, "conditioning_cache_evictions_total", "Entries evicted from the workers' conditioning caches."),
    _define(Gauge, "conditioning_cache_bytes", "Bytes held by the live (and leaving) workers' conditioning caches."),
    # Cancellation and failure.
    _define(Counter, "cancellations_total", "Cancel requests, by the group state they found.", state=CANCEL_STATES),
    _define(Counter, "retries_total", "Slices sent back for retry after a worker failure, by reason.",
            reason=RETRY_REASONS),
    # Not a retry: nothing of it ran, no attempt is counted, and its reply says retries 0.
    _define(Counter, "slices_given_back_total",
            "Slices a leaving worker gave back unstarted, sent to another worker at once."),
    _define(Counter, "worker_failures_total", "Workers lost, by kind; worker_error: an assignment a live worker lost "
            "(it no longer lists it, and its result never came).", kind=WORKER_FAILURE_KINDS),
    _define(Counter, "internal_errors_total",
            "Exceptions raised by code inside the scheduler, by event; the groups concerned were answered "
            "internal_error.", kind=EVENTS),
    _define(Counter, "late_results_total",
            "Batch results discarded because the batch was no longer that worker's (lost, retried)."),
    _define(Gauge, "workers_live", "Workers registered and within their heartbeat deadline."),
    _define(Gauge, "workers_leaving", "Workers that said they are going and still owe results (no new work)."),
    _define(Counter, "worker_departures_total",
            "Workers that left gracefully, by outcome: finished (answered everything they held) or unfinished "
            "(their grace ran out; what they held was retried).", outcome=DEPARTURES),
    _define(Gauge, "draining", "1 while the scheduler admits no new groups (after `drain`, or stopping gracefully "
            "on SIGTERM: it serves what it admitted, then goes), else 0."),
    _define(Counter, "worker_heartbeats_total", "Heartbeats received from workers."),
    # Wire.
    _define(Counter, "protocol_errors_total", "Messages refused, by socket and kind.",
            socket=SOCKETS, kind=PROTOCOL_ERROR_KINDS),
    _define(Counter, "compat_requests_total", "sglang-compat messages, by type.", type=COMPAT_REQUEST_TYPES),
    _define(Counter, "front_restarts_total",
            "Fronts serve started again after they exited (a crash, the OOM killer, a kill), by the client API "
            "each serves: compat (the sglang compat bridge), openpi (the openpi websocket). Each try counts, a "
            "failed one too.", api=FRONT_APIS),
    # Tenants (core/tenants.py) and rights (core/access.py).
    _define(Counter, "tenant_groups_total", "Groups answered, by tenant and outcome (refusals included).",
            tenant=CONFIGURED_TENANTS, outcome=OUTCOMES),
    _define(Counter, "tenant_candidates_total", "Candidates served to groups answered done, by tenant.",
            tenant=CONFIGURED_TENANTS),
    _define(Histogram, "tenant_queue_wait_seconds", "Receipt to first dispatch, per group, by tenant.",
            WAIT_SECONDS_BUCKETS, tenant=CONFIGURED_TENANTS),
    _define(Counter, "resubmissions_total",
            "Submissions of a request id its owner already sent: waiting on the group in flight, or answered "
            "from the kept replies (never run twice).", outcome=RESUBMISSIONS),
    _define(Counter, "forbidden_total", "Requests refused `forbidden` (not the principal's right), by action.",
            action=ACTIONS),
)


class SchedulerMetrics:
    """All metrics of the service, created against one registry.

    Metric objects are attributes named like their exported series without the prefix (counters keep
    `_total`). The recording methods are what the engine (core/engine.py) and the shell call; keep them thin.

    With no registry a fresh one is made (never the global default: a second instance in the same
    process, as in tests, must not collide) and the process/platform/GC collectors are added to it.
    `tenants`: the tenant names of the key directory; any other tenant is recorded as "other".
    """

    def __init__(self, registry: CollectorRegistry | None = None, tenants: Iterable[str] = ()) -> None:
        if registry is None:
            registry = CollectorRegistry()
            prometheus_client.ProcessCollector(registry=registry)
            prometheus_client.PlatformCollector(registry=registry)
            prometheus_client.GCCollector(registry=registry)
        self.registry = registry

        self.build_info = Gauge(PREFIX + "build_info", "Always 1; labels carry the build.",
                                ["version", "python_version"], registry=registry)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self._children: dict[str, dict[tuple[str, ...], Any]] = {}
        self.tenants = (*sorted({"default", *tenants} - {OTHER}), OTHER)
        for kind, name, documentation, buckets, labels in METRICS:
            labels = {k: self.tenants if v is CONFIGURED_TENANTS else v for k, v in labels.items()}
            metric = kind(PREFIX + name, documentation, list(labels), registry=registry, buckets=buckets)
            # Create every labelled child at 0 so each series exists from the first scrape: rate() and
            # dashboards then show 0 rather than "no data", and a counter's first increment is not lost.
            # They are kept, too: a child is then one dict lookup away on the path of every group.
            if labels:
                self._children[name] = {values: metric.labels(*values)
                                        for values in itertools.product(*labels.values())}
            setattr(self, name, metric)
        self.forecast_margins(1.0, 1.0)  # nothing measured yet: forecasts plan with no margin

    # --- Recording methods (the calls server.py makes). ----------------------------------------------

    def group_received(self, api: object = "native") -> None:
        self._children["groups_received_total"][(clip_label(api, APIS),)].inc()

    def candidates_per_group(self, count: int) -> None:
        self.group_candidates.observe(count)

    def admission(self, mode: object, reason: object) -> None:
        """One admission decision; anything but a rejection also counts as an admitted group."""
        mode_label = clip_label(mode, ADMISSION_MODES)
        self._children["admission_decisions_total"][(mode_label, clip_label(reason, ADMISSION_REASONS))].inc()
        if mode_label != "rejected":
            self._children["groups_admitted_total"][(clip_label(mode_label, ADMITTED_MODES),)].inc()

    def microbatches_per_group(self, count: int) -> None:
        self.group_microbatches.observe(count)

    def group_completed(self, outcome: object, latency_seconds: float | None = None) -> None:
        label = clip_label(outcome, OUTCOMES)
        self._children["groups_completed_total"][(label,)].inc()
        if latency_seconds is not None:
            self._children["group_latency_seconds"][(label,)].observe(latency_seconds)

    def queue_depth(self, groups: int, candidates: int) -> None:
        self.queued_groups.set(groups)
        self.queued_candidates.set(candidates)

    def queue_wait(self, seconds: float) -> None:
        self.queue_wait_seconds.observe(seconds)

    def tenant_group(self, tenant: str, outcome: object, served_candidates: int) -> None:
        t = clip_label(tenant, self.tenants)
        self._children["tenant_groups_total"][(t, clip_label(outcome, OUTCOMES))].inc()
        if served_candidates:
            self._children["tenant_candidates_total"][(t,)].inc(served_candidates)

    def tenant_queue_wait(self, tenant: str, seconds: float) -> None:
        self._children["tenant_queue_wait_seconds"][(clip_label(tenant, self.tenants),)].observe(seconds)

    def resubmission(self, outcome: object) -> None:
        self._children["resubmissions_total"][(clip_label(outcome, RESUBMISSIONS),)].inc()

    def forbidden(self, action: object) -> None:
        self._children["forbidden_total"][(clip_label(action, ACTIONS),)].inc()

    def physical_batch(self, rows: int, capacity: int) -> None:
        """A physical batch was dispatched to a worker of `capacity` rows."""
        self.physical_batches_total.inc()
        self.batch_rows.observe(rows)
        if capacity > 0:
            # Not clipped to 1.0: a ratio above 1 lands in +Inf, which is exactly the bug to notice.
            self.batch_occupancy_ratio.observe(rows / capacity)

    def worker_report(self, report: Mapping[str, Any]) -> None:
        """The per-batch report a worker sends with its result (work.BatchReport's fields, convert.report_to_wire)."""
        self.transformer_forwards_total.inc(max(int(report.get("transformer_forwards", 0) or 0), 0))
        # A stage that did not run reports 0.0 (e.g. the whole batch was cancelled before it); only a
        # stage that ran is a sample, or aborted batches would drag the quantiles to zero.
        for key, histogram in (
            ("condition_s", self.conditioning_encode_seconds),
            ("denoise_s", self.denoise_seconds),
            ("postprocess_s", self.action_postprocess_seconds),
        ):
            seconds = report.get(key)
            if seconds and 0 < float(seconds) < math.inf:  # a NaN is truthy, and would stay in the sum
                histogram.observe(float(seconds))

    def reducer_time(self, seconds: float) -> None:
        self.reducer_seconds.observe(seconds)

    def cancellation(self, state: object) -> None:
        """A cancel request arrived; `state` is the group state it found (or "unknown")."""
        label = clip_label(state, CANCEL_STATES + tuple(_FINISHED_STATES))
        self.cancellations_total.labels("done" if label in _FINISHED_STATES else label).inc()

    def retry(self, reason: object) -> None:
        self._children["retries_total"][(clip_label(reason, RETRY_REASONS),)].inc()

    def given_back(self) -> None:
        self.slices_given_back_total.inc()

    def worker_failure(self, kind: object) -> None:
        self.worker_failures_total.labels(clip_label(kind, WORKER_FAILURE_KINDS)).inc()

    def internal_error(self, event: object) -> None:
        self.internal_errors_total.labels(clip_label(event, EVENTS)).inc()

    def prefetch_margin(self, seconds: float) -> None:
        self.prefetch_margin_max_seconds.set(seconds)

    def forecast_margins(self, fleet: float, largest: float) -> None:
        self.forecast_margin.set(fleet)
        self.forecast_margin_max.set(largest)

    def staggered_starts(self, count: int) -> None:
        self.staggered_starts_total.inc(count)

    def late_result(self) -> None:
        self.late_results_total.inc()

    def live_workers(self, count: int) -> None:
        self.workers_live.set(count)

    def leaving_workers(self, count: int) -> None:
        self.workers_leaving.set(count)

    def drain_state(self, draining: bool) -> None:
        self.draining.set(1 if draining else 0)

    def worker_departure(self, outcome: object) -> None:
        self.worker_departures_total.labels(clip_label(outcome, DEPARTURES)).inc()

    def heartbeat(self) -> None:
        self.worker_heartbeats_total.inc()

    def protocol_error(self, socket: object, kind: object, count: int = 1) -> None:
        self.protocol_errors_total.labels(
            clip_label(socket, SOCKETS), clip_label(kind, PROTOCOL_ERROR_KINDS)
        ).inc(count)

    def compat_request(self, kind: object, count: int = 1) -> None:
        self.compat_requests_total.labels(clip_label(kind, COMPAT_REQUEST_TYPES)).inc(count)

    def front_restarted(self, api: object) -> None:
        # from the front watch's thread, the only writer of this counter (metric_values: one writer each)
        self._children["front_restarts_total"][(clip_label(api, FRONT_APIS),)].inc()

    def deadline_refusal(self) -> None:
        self.deadline_refusals_total.inc()

    def deadline_miss(self) -> None:
        self.deadline_misses_total.inc()

    def served(self, requested: int, served: int) -> None:
        self.requested_candidates_total.inc(requested)
        self.served_candidates_total.inc(served)
        if requested > 0:
            self.served_count_ratio.observe(served / requested)

    def prediction(self, predicted_s: float, actual_s: float) -> None:
        # one NaN or inf observed stays in the histogram's sum for the life of the process
        if 0 < predicted_s < math.inf and 0 <= actual_s < math.inf:
            self.prediction_ratio.observe(actual_s / predicted_s)

    def conditioning_cache(self, delta: Mapping[str, int]) -> None:
        for kind in CACHE_KINDS:
            for result in CACHE_RESULTS:
                n = int(delta.get(f"{kind}_{result}{'s' if result == 'hit' else 'es'}", 0) or 0)
                if n > 0:
                    self.conditioning_cache_lookups_total.labels(kind, result).inc(n)
        if int(delta.get("evictions", 0) or 0) > 0:
            self.conditioning_cache_evictions_total.inc(int(delta["evictions"]))

    def conditioning_cache_bytes_in_use(self, n: int) -> None:
        self.conditioning_cache_bytes.set(n)

    def group_joined(self, slices: int = 1) -> None:
        self.groups_joined_total.inc(slices)

    def first_step(self, seconds: float) -> None:
        self.first_step_seconds.observe(seconds)

    def forward(self, rows: int, seconds: float) -> None:
        """One transformer forward a worker ran: its rows and its latency. The worker measures them: a
        broken one's NaN, inf or negative time (or rows) is no forward, and one NaN or inf would stay in
        the histogram's sum for the life of the process."""
        if not (rows > 0 and 0 <= seconds < math.inf):
            return
        self.forward_rows.observe(rows)
        self._children["forward_seconds"][(row_label(rows),)].observe(seconds)


def render(metrics: SchedulerMetrics) -> bytes:
    """The text exposition of `metrics`' registry (what GET /metrics returns)."""
    return generate_latest(metrics.registry)


def start_http_server(
    metrics: SchedulerMetrics,
    host: str = DEFAULT_METRICS_HOST,
    port: int = DEFAULT_METRICS_PORT,
) -> tuple[WSGIServer, threading.Thread, int]:
    """Serve /metrics of `metrics`' registry from a daemon thread.

    Returns (server, thread, bound_port); port 0 binds a free port and bound_port says which. Stop it
    with `stop_http_server(server, thread)`.
    """
    server, thread = prometheus_client.start_http_server(port, addr=host, registry=metrics.registry)
    return server, thread, server.server_port


def stop_http_server(server: WSGIServer, thread: threading.Thread, timeout: float = 5.0) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout)
