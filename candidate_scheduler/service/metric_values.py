"""Prometheus counters, gauges and histograms for a process that records from one thread.

The scheduler records every metric on its loop thread; only the exporter's thread reads them, at a
scrape. prometheus_client guards each value with a lock and checks each call: about 0.3 us an
increment and 0.8 us an observation (timeit, best of five), some twenty of them for every group the
loop answers. One writer
needs no lock under CPython's interpreter lock, so these values are plain attributes and lists (the
engine with metrics recording then answered 1.07-1.12x the groups a second in process:
bench/results/metric_values_20261205):

- an update is a few bytecodes: a scrape sees it whole or not yet;
- a scrape reads a histogram's counts and its sum together, before anything else, and takes its count
  from the same copy of the counts: its buckets and count agree, and its sum is at most the one
  observation the writer was making apart (tested);
- a new child (a `labels()` call with new values) is made under a lock that a scrape takes to copy the
  children, so a scrape never iterates the children while one is added. SchedulerMetrics makes every
  child up front, so the path every group takes never reaches that lock.

The exposition is prometheus_client's own (its metric families and text format), with the same series,
`_created` samples included, as its Counter, Gauge and Histogram would export. Record from one thread
only: two writers could lose an increment.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class CounterValue:
    __slots__ = ("value", "created")

    def __init__(self, _metric: Family) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class GaugeValue:
    __slots__ = ("value",)

    def __init__(self, _metric: Family) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramValue:
    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, metric: Family) -> None:
        self.bounds = metric.bounds
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount == amount:  # NaN counts in no bucket, as in prometheus_client
            # a bucket's bound is inclusive (le): the first bound >= amount
            self.counts[bisect.bisect_left(self.bounds, amount)] += 1


class Family:
    """One metric and its labelled children; registered as a collector of `registry`."""

    family_class: type = CounterMetricFamily
    value_class: type = CounterValue

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None, buckets: Sequence[float] | None = None) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        if (buckets is None) != (self.family_class is not HistogramMetricFamily):
            raise TypeError(f"{name}: a histogram has buckets, and only a histogram")
        if buckets is not None:
            bounds = [float(b) for b in buckets if b != float("inf")]
            if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
                raise ValueError(f"{name}: buckets must increase")
            self.bounds = tuple(bounds)
        self._children: dict[tuple[str, ...], object] = {}
        self._adding = threading.Lock()
        self._only = None if self.labelnames else self._child(())
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object):
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected {len(self.labelnames)} label values, got {len(values)}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        return child if child is not None else self._child(key)

    def _child(self, key: tuple[str, ...]):
        with self._adding:
            return self._children.setdefault(key, self.value_class(self))

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        with self._adding:
            children = list(self._children.items())
        for key, child in children:
            self._add(family, key, child)
        return [family]

    def _family(self) -> Metric:
        return self.family_class(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, key: tuple[str, ...], child) -> None:
        raise NotImplementedError


class Counter(Family):
    family_class, value_class = CounterMetricFamily, CounterValue

    def inc(self, amount: float = 1.0) -> None:
        self._only.inc(amount)

    def _add(self, family: Metric, key: tuple[str, ...], child: CounterValue) -> None:
        family.add_metric(key, child.value, created=child.created)


class Gauge(Family):
    family_class, value_class = GaugeMetricFamily, GaugeValue

    def set(self, value: float) -> None:
        self._only.set(value)

    def _add(self, family: Metric, key: tuple[str, ...], child: GaugeValue) -> None:
        family.add_metric(key, child.value)


class Histogram(Family):
    family_class, value_class = HistogramMetricFamily, HistogramValue

    def observe(self, amount: float) -> None:
        self._only.observe(amount)

    def _add(self, family: Metric, key: tuple[str, ...], child: HistogramValue) -> None:
        # both before any call: no other thread runs between the two reads (a call may hand it the
        # interpreter), so the sum is at most the writer's observation in progress ahead of the counts
        counts, total = child.counts[:], child.sum
        cumulative, running = [], 0
        for bound, n in zip((*child.bounds, float("inf")), counts):
            running += n
            cumulative.append((floatToGoString(bound), running))
        family.add_metric(key, cumulative, total)
        family.samples.append(Sample(self.name + "_created", dict(zip(self.labelnames, key)), child.created))
