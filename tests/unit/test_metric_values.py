"""service/metric_values.py against prometheus_client itself: the same operations give the same
exposition, series for series (bar the `_created` timestamps), and a scrape during recording sees a
histogram whose buckets and count agree."""

from __future__ import annotations

import sys
import threading

import prometheus_client
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from candidate_scheduler.service import metric_values
from candidate_scheduler.service.metrics import SECONDS_BUCKETS

LABELS = ("a", "b", "other")
OPS = st.lists(st.one_of(
    st.tuples(st.just("inc"), st.sampled_from(LABELS), st.floats(0, 1e6, allow_nan=False)),
    st.tuples(st.just("set"), st.sampled_from(LABELS), st.floats(-1e6, 1e6, allow_nan=False)),
    # bucket bounds themselves included: a bound is inclusive (le)
    st.tuples(st.just("observe"), st.sampled_from(LABELS),
              st.one_of(st.sampled_from(SECONDS_BUCKETS), st.floats(0, 100, allow_nan=False),
                        st.sampled_from((float("inf"), float("nan"), -1.0)))),
), max_size=40)


def _both(module):
    registry = CollectorRegistry()
    metrics = {
        "counter": module.Counter("t_things_total", "Things.", ["k"], registry=registry),
        "plain": module.Counter("t_plain_total", "Plain.", registry=registry),
        "gauge": module.Gauge("t_level", "Level.", ["k"], registry=registry),
        "histogram": module.Histogram("t_wait_seconds", "Wait.", ["k"], registry=registry, buckets=SECONDS_BUCKETS),
    }
    for label in LABELS:  # as SchedulerMetrics does: every series from the start
        for name in ("counter", "gauge", "histogram"):
            metrics[name].labels(label)
    return registry, metrics


def _text(registry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@settings(max_examples=80, deadline=None)
@given(OPS)
def test_the_same_operations_give_the_same_exposition(ops):
    ours, theirs = _both(metric_values), _both(prometheus_client)
    for op, label, amount in ops:
        for _registry, metrics in (ours, theirs):
            if op == "inc":
                metrics["counter"].labels(label).inc(amount)
                metrics["plain"].inc(amount)
            elif op == "set":
                metrics["gauge"].labels(label).set(amount)
            else:
                metrics["histogram"].labels(label).observe(amount)
    assert _text(ours[0]) == _text(theirs[0])


def test_created_samples_are_exported_like_prometheus_client():
    ours, theirs = _both(metric_values), _both(prometheus_client)
    created = [{line.split(" ")[0] for line in generate_latest(r).decode().splitlines() if "_created" in line}
               for r in (ours[0], theirs[0])]
    assert created[0] == created[1] and created[0]


def test_misuse_is_refused():
    metric = metric_values.Counter("t_refused_total", "Refused.", ["k"])
    with pytest.raises(ValueError):
        metric.labels("a").inc(-1)
    with pytest.raises(ValueError):
        metric.labels("a", "b")
    with pytest.raises(TypeError):
        metric_values.Histogram("t_no_buckets_seconds", "No buckets.")
    with pytest.raises(ValueError):
        metric_values.Histogram("t_bad_seconds", "Bad.", buckets=(1.0, 0.5))
    registry = CollectorRegistry()
    metric_values.Gauge("t_twice", "Twice.", registry=registry)
    with pytest.raises(ValueError):  # the registry sees the name, as with prometheus_client's own
        metric_values.Gauge("t_twice", "Twice.", registry=registry)


def test_a_scrape_during_recording_sees_the_sum_and_count_of_one_instant():
    # every observation is 1.0, so the sum is the count; a scrape may catch the writer between its two
    # updates (the sum first), never further apart
    registry = CollectorRegistry()
    histogram = metric_values.Histogram("t_busy_seconds", "Busy.", registry=registry, buckets=SECONDS_BUCKETS)
    stop = threading.Event()

    def record():
        while not stop.is_set():
            histogram.observe(1.0)

    writer = threading.Thread(target=record)
    writer.start()
    try:
        for _ in range(2000):
            samples = {s.name + s.labels.get("le", ""): s.value for f in registry.collect() for s in f.samples}
            count, total = samples["t_busy_seconds_count"], samples["t_busy_seconds_sum"]
            assert count <= total <= count + 1, (count, total)
            assert samples["t_busy_seconds_bucket+Inf"] == count
    finally:
        stop.set()
        writer.join()
    assert registry.get_sample_value("t_busy_seconds_count") > 0


def test_children_added_while_scraping_are_never_half_seen():
    registry = CollectorRegistry()
    counter = metric_values.Counter("t_many_total", "Many.", ["k"], registry=registry)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the interpreter between the threads as often as it will go
    errors = []

    def add():
        for n in range(3000):
            counter.labels(f"v{n}").inc()

    writer = threading.Thread(target=add)
    writer.start()
    try:
        while writer.is_alive():
            try:
                list(registry.collect())
            except RuntimeError as exc:  # "dictionary changed size during iteration" without the lock
                errors.append(exc)
    finally:
        writer.join()
        sys.setswitchinterval(interval)
    assert not errors
    assert registry.get_sample_value("t_many_total", {"k": "v2999"}) == 1
