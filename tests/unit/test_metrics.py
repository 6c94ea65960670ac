"""SchedulerMetrics: naming, recording methods, bounded labels, exposition and the /metrics server."""

import dataclasses
import urllib.request
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from candidate_scheduler import __version__
from candidate_scheduler.core import admission, group_state
from candidate_scheduler.core.work import BatchReport
from candidate_scheduler.service import metrics as m
from candidate_scheduler.service.metrics import SchedulerMetrics

P = m.PREFIX
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def sm(registry):
    return SchedulerMetrics(registry)


def value(registry, name, **labels):
    v = registry.get_sample_value(P + name, labels)
    return 0.0 if v is None else v


def buckets(registry, name, *edges, **labels):
    """A histogram's cumulative counts at the given bucket edges (le), e.g. [0, 1, 2]."""
    return [value(registry, name + "_bucket", le=edge, **labels) for edge in edges]


def families(registry):
    return {f.name: f for f in registry.collect()}


# --- naming ---------------------------------------------------------------------------------------


def test_naming_follows_prometheus_practice(registry, sm):
    fams = families(registry)
    assert len(fams) >= 25
    for name, fam in fams.items():
        assert name.startswith(P) and ":" not in name, name
        assert fam.type in {"counter", "gauge", "histogram"}, (name, fam.type)  # no summaries
        if fam.type == "histogram" and "seconds" in name:
            assert name.endswith("_seconds")
        for sample in fam.samples:
            # Ids as labels would be unbounded; only the closed label names are allowed ("rows" takes
            # the ten values of metrics.ROW_LABELS, "result" hit or miss).
            assert set(sample.labels) <= {
                "api", "mode", "outcome", "reason", "state", "kind", "socket", "type", "le",
                "version", "python_version", "rows", "result", "tenant", "action",
            }, sample


def test_counters_are_exposed_with_total_suffix(registry, sm):
    text = m.render(sm).decode()
    for fam in families(registry).values():
        if fam.type == "counter":
            assert f"{fam.name}_total" in text


def test_latency_buckets_span_one_millisecond_to_a_minute_and_a_groups_waits_an_hour():
    assert m.SECONDS_BUCKETS[0] == 0.001 and m.SECONDS_BUCKETS[-1] == 60.0
    assert list(m.SECONDS_BUCKETS) == sorted(m.SECONDS_BUCKETS)
    assert m.WAIT_SECONDS_BUCKETS[0] == 0.001 and m.WAIT_SECONDS_BUCKETS[-1] == 3600.0
    assert list(m.WAIT_SECONDS_BUCKETS) == sorted(set(m.WAIT_SECONDS_BUCKETS))
    assert m.COUNT_BUCKETS[0] == 1 and m.COUNT_BUCKETS[-1] == 256
    assert m.OCCUPANCY_BUCKETS[0] == 0.1 and m.OCCUPANCY_BUCKETS[-1] == 1.0


def test_build_info(registry, sm):
    samples = [s for s in families(registry)[P + "build_info"].samples]
    assert len(samples) == 1 and samples[0].value == 1
    assert samples[0].labels["version"] == __version__


def test_labelled_series_exist_at_zero_before_any_event(registry, sm):
    # Dashboards and rate() need the series from the first scrape.
    assert registry.get_sample_value(P + "groups_completed_total", {"outcome": "expired"}) == 0
    assert registry.get_sample_value(
        P + "protocol_errors_total", {"socket": "compat", "kind": "pickle_refused"}
    ) == 0
    assert registry.get_sample_value(
        P + "group_latency_seconds_count", {"outcome": "done"}
    ) == 0


def test_two_default_instances_do_not_collide():
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.heartbeat()
    assert a.registry is not b.registry
    assert b.registry.get_sample_value(P + "worker_heartbeats_total") == 0
    # The default registry carries the process collectors too (on Linux).
    assert b"python_info" in m.render(b)


# --- recording methods ----------------------------------------------------------------------------


def test_group_received(registry, sm):
    sm.group_received()
    sm.group_received("compat")
    sm.group_received("compat")
    assert value(registry, "groups_received_total", api="native") == 1
    assert value(registry, "groups_received_total", api="compat") == 2


def test_a_group_is_counted_under_the_api_it_came_in_by(registry, sm):
    """The fronts mark their SUBMITs (compat/mapping.py, openpi/observation.py); the engine counted every
    group as native, so compat and openpi traffic never showed."""
    from candidate_scheduler.convert import submission_from_wire
    from candidate_scheduler.core.engine import Engine
    from candidate_scheduler.service.requests import make_request

    engine = Engine(metrics=sm)
    image = np.zeros((16, 16, 3), np.uint8)
    for api in ("compat", "openpi", "openpi", "native", "something-else"):
        msg = msgspec.structs.replace(make_request(image, "pick"), api=api)
        engine.submit(("c", msg.request_id), submission_from_wire(msg), 0.0)
    assert value(registry, "groups_received_total", api="compat") == 1
    assert value(registry, "groups_received_total", api="openpi") == 2
    assert value(registry, "groups_received_total", api="native") == 1
    assert value(registry, "groups_received_total", api="other") == 1


def test_admission_atomic(registry, sm):
    sm.candidates_per_group(8)
    sm.admission("atomic", "fits")
    sm.microbatches_per_group(1)
    assert value(registry, "admission_decisions_total", mode="atomic", reason="fits") == 1
    assert value(registry, "groups_admitted_total", mode="atomic") == 1
    assert value(registry, "group_candidates_count") == 1
    assert value(registry, "group_candidates_sum") == 8
    assert buckets(registry, "group_candidates", "4.0", "8.0") == [0, 1]
    assert buckets(registry, "group_microbatches", "1.0") == [1]


def test_admission_accepts_enums(registry, sm):
    sm.admission(admission.AdmissionMode.MICROBATCH, admission.REASON_OVER_CAPACITY)
    sm.microbatches_per_group(2)
    assert value(registry, "admission_decisions_total", mode="microbatch", reason="over_capacity") == 1
    assert value(registry, "groups_admitted_total", mode="microbatch") == 1
    assert value(registry, "group_microbatches_sum") == 2


def test_rejection_is_a_decision_not_an_admission(registry, sm):
    sm.admission("rejected", "count_over_limit")
    assert value(registry, "admission_decisions_total", mode="rejected", reason="count_over_limit") == 1
    assert sum(value(registry, "groups_admitted_total", mode=x) for x in m.ADMITTED_MODES) == 0


def test_group_completed_by_outcome(registry, sm):
    sm.group_completed("done", 0.3)
    sm.group_completed(group_state.FINISHED_REASONS[group_state.GroupStatus.EXPIRED], 61.0)
    sm.group_completed("overloaded")  # no latency given: counted, not timed
    assert value(registry, "groups_completed_total", outcome="done") == 1
    assert buckets(registry, "group_latency_seconds", "0.25", "0.5", outcome="done") == [0, 1]
    assert buckets(registry, "group_latency_seconds", "60.0", "120.0", outcome="expired") == [0, 1]
    sm.queue_wait(400.0)  # a backlog of minutes reads as minutes, not as "over a minute"
    assert buckets(registry, "queue_wait_seconds", "60.0", "300.0", "600.0", "+Inf") == [0, 0, 1, 1]
    assert value(registry, "groups_completed_total", outcome="overloaded") == 1
    assert value(registry, "group_latency_seconds_count", outcome="overloaded") == 0


def test_queue(registry, sm):
    sm.queue_depth(3, 40)
    sm.queue_wait(0.004)
    assert value(registry, "queued_groups") == 3
    assert value(registry, "queued_candidates") == 40
    assert buckets(registry, "queue_wait_seconds", "0.005") == [1]
    sm.queue_depth(0, 0)
    assert value(registry, "queued_candidates") == 0


def test_physical_batch_and_occupancy(registry, sm):
    sm.physical_batch(6, 8)
    sm.physical_batch(8, 8)
    assert value(registry, "physical_batches_total") == 2
    assert value(registry, "batch_rows_sum") == 14
    assert buckets(registry, "batch_occupancy_ratio", "0.7", "0.8", "1.0") == [0, 1, 2]


def test_worker_report(registry, sm):
    report = BatchReport(rows=6, condition_s=0.02, denoise_s=1.5, postprocess_s=0.003, transformer_forwards=10)
    sm.worker_report(dataclasses.asdict(report))
    sm.worker_report(dataclasses.asdict(BatchReport()))  # a batch cancelled before any stage ran
    assert value(registry, "transformer_forwards_total") == 10
    assert value(registry, "conditioning_encode_seconds_count") == 1
    assert value(registry, "denoise_seconds_count") == 1
    assert value(registry, "denoise_seconds_sum") == 1.5
    assert buckets(registry, "action_postprocess_seconds", "0.0025", "0.005") == [0, 1]
    sm.worker_report({})  # an old worker that sends no report
    assert value(registry, "transformer_forwards_total") == 10


def test_reducer_time(registry, sm):
    sm.reducer_time(0.0007)
    assert buckets(registry, "reducer_seconds", "0.001") == [1]


def test_cancellations_by_state(registry, sm):
    sm.cancellation(group_state.GroupStatus.RUNNING)
    sm.cancellation("queued")
    sm.cancellation(group_state.GroupStatus.CANCELLED)  # already finished
    sm.cancellation("expired")  # already finished
    sm.cancellation("done")
    sm.cancellation("unknown")
    assert value(registry, "cancellations_total", state="running") == 1
    assert value(registry, "cancellations_total", state="queued") == 1
    assert value(registry, "cancellations_total", state="done") == 3
    assert value(registry, "cancellations_total", state="unknown") == 1


def test_workers(registry, sm):
    sm.live_workers(2)
    sm.heartbeat()
    sm.heartbeat()
    sm.retry("heartbeat_timeout")
    sm.worker_failure("reregistered")
    sm.late_result()
    sm.staggered_starts(3)
    sm.prefetch_margin(0.02)
    assert value(registry, "workers_live") == 2
    assert value(registry, "prefetch_margin_max_seconds") == 0.02
    assert value(registry, "staggered_starts_total") == 3
    assert value(registry, "worker_heartbeats_total") == 2
    assert value(registry, "retries_total", reason="heartbeat_timeout") == 1
    assert value(registry, "worker_failures_total", kind="reregistered") == 1
    assert value(registry, "late_results_total") == 1


def test_wire(registry, sm):
    sm.protocol_error("compat", "pickle_refused")
    sm.compat_request("req_list")
    assert value(registry, "protocol_errors_total", socket="compat", kind="pickle_refused") == 1
    assert value(registry, "compat_requests_total", type="req_list") == 1


# --- bounded labels -------------------------------------------------------------------------------

UNKNOWN = "group-7f3a9c"  # what an id leaking into a label would look like


@pytest.mark.parametrize(
    "record, sample, labels",
    [
        (lambda s: s.group_received(UNKNOWN), "groups_received_total", {"api": "other"}),
        (lambda s: s.admission(UNKNOWN, UNKNOWN), "admission_decisions_total",
         {"mode": "other", "reason": "other"}),
        (lambda s: s.admission("atomic", UNKNOWN), "admission_decisions_total",
         {"mode": "atomic", "reason": "other"}),
        (lambda s: s.admission(UNKNOWN, "fits"), "groups_admitted_total", {"mode": "other"}),
        (lambda s: s.group_completed(UNKNOWN, 1.0), "groups_completed_total", {"outcome": "other"}),
        (lambda s: s.group_completed(UNKNOWN, 1.0), "group_latency_seconds_count", {"outcome": "other"}),
        (lambda s: s.cancellation(UNKNOWN), "cancellations_total", {"state": "other"}),
        (lambda s: s.retry(UNKNOWN), "retries_total", {"reason": "other"}),
        (lambda s: s.worker_failure(UNKNOWN), "worker_failures_total", {"kind": "other"}),
        (lambda s: s.protocol_error(UNKNOWN, UNKNOWN), "protocol_errors_total",
         {"socket": "other", "kind": "other"}),
        (lambda s: s.protocol_error("request", UNKNOWN), "protocol_errors_total",
         {"socket": "request", "kind": "other"}),
        (lambda s: s.compat_request(UNKNOWN), "compat_requests_total", {"type": "other"}),
    ],
)
def test_unknown_label_values_become_other(registry, sm, record, sample, labels):
    record(sm)
    assert value(registry, sample, **labels) == 1
    assert UNKNOWN.encode() not in m.render(sm)


def label_sets(registry):
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for fam in registry.collect()
        for s in fam.samples
        if not s.name.endswith("_created")
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=8))
def test_cardinality_is_fixed_whatever_the_inputs(texts):
    registry = CollectorRegistry()
    sm = SchedulerMetrics(registry)
    before = label_sets(registry)
    for t in texts:
        sm.group_received(t)
        sm.admission(t, t)
        sm.group_completed(t, 0.1)
        sm.cancellation(t)
        sm.retry(t)
        sm.worker_failure(t)
        sm.protocol_error(t, t)
        sm.compat_request(t)
    # Every series existed at start-up: no input can add one.
    assert label_sets(registry) == before


def test_label_sets_cover_the_pure_rooms():
    # If admission or group_state grows a value, it must be added here, not silently become "other".
    assert set(admission.ADMISSION_REASONS) <= set(m.ADMISSION_REASONS)
    assert {mode.value for mode in admission.AdmissionMode} <= set(m.ADMISSION_MODES)
    assert set(group_state.FINISHED_REASONS.values()) <= set(m.OUTCOMES)
    for status in group_state.GroupStatus:
        assert m.clip_label(status, m.CANCEL_STATES + tuple(m._FINISHED_STATES)) != m.OTHER


def test_clip_label():
    assert m.clip_label("fits", m.ADMISSION_REASONS) == "fits"
    assert m.clip_label(admission.AdmissionMode.ATOMIC, m.ADMISSION_MODES) == "atomic"
    assert m.clip_label(group_state.GroupStatus.REDUCING, m.CANCEL_STATES) == "reducing"
    assert m.clip_label(None, m.OUTCOMES) == "other"
    assert m.clip_label(7, m.OUTCOMES) == "other"


# --- exposition -----------------------------------------------------------------------------------


def test_render_parses_back(registry, sm):
    sm.group_completed("done", 0.5)
    parsed = {f.name: f for f in text_string_to_metric_families(m.render(sm).decode())}
    assert parsed[P + "groups_completed"].type == "counter"
    assert parsed[P + "group_latency_seconds"].type == "histogram"
    # The text format carries each _created as a gauge family of its own.
    assert {n for n in parsed if not n.endswith("_created")} == set(families(registry))


def test_http_server_serves_the_registry_on_port_zero(registry, sm):
    sm.group_received("compat")
    server, thread, port = m.start_http_server(sm, "127.0.0.1", 0)
    try:
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert reply.status == 200
            body = reply.read().decode()
        assert f'{P}groups_received_total{{api="compat"}} 1.0' in body
        # Only this registry: no process collectors from the global default.
        assert "process_cpu_seconds_total" not in body
    finally:
        m.stop_http_server(server, thread)
    assert not thread.is_alive()


def test_default_port():
    assert (m.DEFAULT_METRICS_HOST, m.DEFAULT_METRICS_PORT) == ("127.0.0.1", 9464)


def test_docs_list_every_metric(registry, sm):
    doc = (REPO / "docs" / "metrics.md").read_text()
    text = m.render(sm).decode()
    for fam in families(registry).values():
        exposed = fam.name + "_total" if fam.type == "counter" else fam.name
        assert exposed in text
        assert f"`{exposed}`" in doc, f"docs/metrics.md does not list {exposed}"
    assert str(m.DEFAULT_METRICS_PORT) in doc
