"""The metrics exporter and the Grafana dashboards against a real Prometheus (Debian's `prometheus`).

Two live schedulers with metrics on are scraped every second by a real Prometheus:
  * "main": default (microbatch) policy, one real Cosmos3 worker of capacity 4;
  * "reject": `--policy reject`, one null worker of capacity 4 (admission rejections).
A background thread keeps a short, varied load going on both (atomic and microbatched groups, several
reducers, an invalid reducer, admission rejections, cancels of running / queued / finished / unknown
groups, malformed frames on the request and control sockets) while the test
  1. runs `promtool check metrics` on each scheduler's live exposition;
  2. evaluates EVERY query of every dashboard through Prometheus's HTTP API and asserts each returns at
     least one sample whose value is a number (NaN is what Grafana draws as an empty panel), and that the
     load is actually visible in Prometheus (rejections, microbatches, cancels, protocol errors, ...).

Prometheus must be installed (`make system-deps`); the test skips without it only outside CI.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import msgspec
import pytest
import zmq

from candidate_scheduler import protocol
from candidate_scheduler.service.client import make_request, synthetic_image
from candidate_scheduler.service.dashboards_check import dashboard_queries
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.sglang  # the Cosmos3 worker process imports sglang

IMAGE = synthetic_image(64, 64, seed=21)
PROMPT = "stack the blocks"
GRAFANA_DIR = ROOT / "grafana"
SCRAPE_INTERVAL_S = 1
# Grafana's built-in variables, as Grafana would expand them for a short dashboard range with a 1 s
# scrape interval ($__rate_interval = max($__interval + scrape interval, 4 x scrape interval), padded).
# An unknown variable fails the test: a new one must be given a value here, not silently dropped.
GRAFANA_VARIABLES = {
    "__rate_interval": "15s",
    "__interval": "5s",
    "__interval_ms": "5000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
    "datasource": "prometheus",
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
QUERY_DEADLINE_S = 60.0

# The load must show up in Prometheus, not only as zero-valued series: (what, PromQL that must be > 0).
LOAD_VISIBLE = [
    ("live workers on both schedulers", "sum(candidate_scheduler_workers_live) >= 2"),
    ("atomic admissions", 'sum(increase(candidate_scheduler_admission_decisions_total{mode="atomic",reason="fits"}[5m]))'),
    ("microbatched groups", 'sum(increase(candidate_scheduler_admission_decisions_total{mode="microbatch",reason="over_capacity"}[5m]))'),
    ("admission rejections", 'sum(increase(candidate_scheduler_admission_decisions_total{mode="rejected",reason="does_not_fit"}[5m]))'),
    ("groups split into > 1 microbatch", 'sum(increase(candidate_scheduler_group_microbatches_bucket{le="1.0"}[5m])) < sum(increase(candidate_scheduler_group_microbatches_count[5m]))'),
    ("done answers", 'sum(increase(candidate_scheduler_groups_completed_total{outcome="done"}[5m]))'),
    ("rejected answers", 'sum(increase(candidate_scheduler_groups_completed_total{outcome="rejected"}[5m]))'),
    ("invalid answers", 'sum(increase(candidate_scheduler_groups_completed_total{outcome="invalid"}[5m]))'),
    ("cancelled answers", 'sum(increase(candidate_scheduler_groups_completed_total{outcome="cancelled"}[5m]))'),
    ("cancels of live groups", 'sum(increase(candidate_scheduler_cancellations_total{state=~"queued|admitted|running"}[5m]))'),
    ("cancels of finished groups", 'sum(increase(candidate_scheduler_cancellations_total{state="done"}[5m]))'),
    ("cancels of unknown groups", 'sum(increase(candidate_scheduler_cancellations_total{state="unknown"}[5m]))'),
    ("request-socket protocol errors", 'sum(increase(candidate_scheduler_protocol_errors_total{socket="request"}[5m]))'),
    ("control-socket protocol errors", 'sum(increase(candidate_scheduler_protocol_errors_total{socket="control"}[5m]))'),
    ("transformer forwards", "sum(increase(candidate_scheduler_transformer_forwards_total[5m]))"),
    ("slices joining running batches", "sum(increase(candidate_scheduler_groups_joined_total[5m]))"),
    ("deadline refusals", "sum(increase(candidate_scheduler_deadline_refusals_total[5m]))"),
    ("cost-model predictions", "sum(increase(candidate_scheduler_prediction_ratio_count[5m]))"),
    ("conditioning cache lookups", "sum(increase(candidate_scheduler_conditioning_cache_lookups_total[5m]))"),
    ("Cosmos3 conditioning-encode samples", "sum(increase(candidate_scheduler_conditioning_encode_seconds_count[5m]))"),
    ("reducer samples", "sum(increase(candidate_scheduler_reducer_seconds_count[5m]))"),
    ("worker heartbeats", "sum(increase(candidate_scheduler_worker_heartbeats_total[5m]))"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binaries() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus and promtool:
        return prometheus, promtool
    message = ("Debian's prometheus/promtool are not installed (run `make system-deps`, "
               "or `apt-get install prometheus`)")
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must install them")
    pytest.skip(message)


def expand_grafana(expr: str) -> str:
    """Replace Grafana template variables the way Grafana would before sending the query."""
    def value(m: re.Match) -> str:
        name = next(g for g in m.groups() if g)
        if name not in GRAFANA_VARIABLES:
            raise AssertionError(f"dashboard query uses Grafana variable ${name} this test has no value for: {expr}")
        return GRAFANA_VARIABLES[name]

    return _VARIABLE.sub(value, expr)


class Prometheus:
    """A real Prometheus server on a free loopback port, scraping `targets` every second."""

    def __init__(self, binary: str, targets: list[str], workdir: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
            f"  scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
            f"  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
            "scrape_configs:\n"
            "  - job_name: candidate_scheduler\n"
            "    metrics_path: /metrics\n"
            "    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir,
        )

    def _get(self, path: str, **params: str) -> dict | str:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
        return json.loads(body) if path.startswith("/api/") else body

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                return "Ready" in self._get("/-/ready")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_for(ready, timeout_s, "prometheus /-/ready", interval_s=0.2)

    def wait_targets_up(self, n: int, timeout_s: float = 30.0) -> None:
        def up():
            active = self._get("/api/v1/targets", state="active")["data"]["activeTargets"]
            return len(active) == n and all(t["health"] == "up" for t in active)

        wait_for(up, timeout_s, f"{n} scrape target(s) up", interval_s=0.2)

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """Instant query; [(labels, value)] (a scalar result is one sample with no labels)."""
        try:
            reply = self._get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as exc:  # 400 on a PromQL error: say which and why
            raise AssertionError(f"prometheus refused {expr!r}: {exc.read().decode()[:500]}") from None
        assert reply["status"] == "success", (expr, reply)
        data = reply["data"]
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def _raw(endpoint: str, frames: list[bytes], timeout_ms: int = 2000) -> list[bytes] | None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        return sock.recv_multipart() if sock.poll(timeout_ms) else None
    finally:
        sock.close(0)


class Load(threading.Thread):
    """Rounds of varied traffic on both schedulers until stopped; the first error ends it (and the test)."""

    REDUCERS = ("mean", "median", "medoid", "none")

    def __init__(self, main, reject):
        super().__init__(daemon=True, name="prometheus-test-load")
        self.main, self.reject = main, reject
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.rounds = 0

    def run(self) -> None:
        try:
            with self.main.client(timeout_s=60) as m, self.reject.client(timeout_s=30) as r:
                while not self.stop_event.is_set():
                    self._round(m, r, self.rounds)
                    self.rounds += 1
                    self.stop_event.wait(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc

    def _round(self, m, r, i: int) -> None:
        reducer = self.REDUCERS[i % len(self.REDUCERS)]
        # Cancels while running and while queued behind it: a long group fills the worker (capacity 4).
        blocker = m.send(make_request(IMAGE, PROMPT, count=4, seed=i, steps=300, reducer=reducer))
        wait_for(lambda: m.status(blocker).state in ("running", "done"), 30, "the blocker to run")
        behind = m.send(make_request(IMAGE, PROMPT, count=2, seed=1000 + i))
        m.cancel(behind)
        m.cancel(blocker)
        for rid in (behind, blocker):
            assert m.wait(rid).status in ("cancelled", "done"), rid
        # Groups that run: atomic (2 and 4 candidates), microbatched (8 on capacity 4), several reducers.
        ids = [
            m.send(make_request(IMAGE, PROMPT, count=2, seed=10 + i, reducer=reducer)),
            m.send(make_request(IMAGE, PROMPT, count=4, seed=20 + i, reducer="medoid", return_candidates=True)),
            m.send(make_request(IMAGE, PROMPT, count=8, seed=30 + i, reducer="median" if i % 2 else "mean")),
        ]
        results = [m.wait(rid) for rid in ids]
        assert [x.status for x in results] == ["done"] * 3, [(x.status, x.error) for x in results]
        assert results[2].metrics["admission_mode"] == "microbatch", results[2].metrics
        bad = m.submit(IMAGE, PROMPT, count=2, reducer="no-such-reducer")
        assert bad.status == "invalid" and bad.error_code == "unknown_reducer", (bad.status, bad.error_code)
        assert m.cancel(ids[0]).state == "done"
        assert m.cancel(f"never-seen-{i}").state == "unknown"
        # Malformed frames: undecodable msgpack on the request socket, a wrongly typed payload on control.
        reply = _raw(self.main.request, [protocol.header(protocol.Kind.SUBMIT), b"\xc1\xc1\xc1"])
        assert reply is not None and protocol.parse_header(reply[0], {protocol.Kind.ERROR}) is protocol.Kind.ERROR
        reply = _raw(self.main.control, [protocol.header(protocol.Kind.CANCEL), msgspec.msgpack.encode([1, 2, 3])])
        assert reply is not None and protocol.parse_header(reply[0], {protocol.Kind.ERROR}) is protocol.Kind.ERROR
        # Admission rejection (6 > capacity 4 under --policy reject), and a group that fits.
        x = r.submit(IMAGE, PROMPT, count=6, seed=i)
        assert x.status == "rejected" and x.error_code == "does_not_fit", (x.status, x.error_code)
        assert r.submit(IMAGE, PROMPT, count=3, seed=i, reducer=reducer).status == "done"
        # Step-level batching and deadlines (the "reject" scheduler runs --batching step): a short group
        # joins a long one; a group whose deadline cannot be met is refused at once.
        long = r.send(make_request(IMAGE, PROMPT, count=2, seed=i, steps=200))
        wait_for(lambda: r.status(long).state == "running", 30, "the long group to run")
        assert r.submit(IMAGE, PROMPT, count=2, seed=i, steps=4).metrics["joined_running_batches"] == 1
        late = r.submit(IMAGE, PROMPT, count=4, seed=i, steps=10, deadline_s=0.05)
        assert late.status == "rejected" and late.error_code == "deadline_unmeetable", (late.status, late.error)
        r.cancel(long)
        assert r.wait(long).status == "cancelled"


def _host_port(metrics_url: str) -> str:
    return urllib.parse.urlsplit(metrics_url).netloc


def test_dashboards_have_data_in_a_real_prometheus(services, model_dir, tmp_path):
    prometheus_bin, promtool = _binaries()
    queries = dashboard_queries(GRAFANA_DIR)
    assert queries, f"no dashboard queries found under {GRAFANA_DIR}"
    expanded = [(dash, panel, expr, expand_grafana(expr)) for dash, panel, expr in queries]

    main = services.scheduler(metrics=True)
    services.worker(main, "cosmos3", 4)
    reject = services.scheduler("--policy", "reject", "--batching", "step", metrics=True)
    services.worker(reject, "null", 4, 0.01)
    # Prometheus starts while the Cosmos3 worker loads: counters are scraped at 0 before the load.
    prom = Prometheus(prometheus_bin, [_host_port(main.metrics), _host_port(reject.metrics)], tmp_path)
    load = Load(main, reject)
    try:
        prom.wait_ready()
        prom.wait_targets_up(2)
        main.wait_workers(1, timeout_s=180)
        reject.wait_workers(1, timeout_s=60)
        time.sleep(2 * SCRAPE_INTERVAL_S)  # at least one scrape of the idle, registered state
        load.start()
        wait_for(lambda: load.rounds >= 2 or load.error, 90, "two rounds of load")
        assert load.error is None, f"load failed: {load.error!r}"

        # 1. promtool on each live exposition.
        for name, handle in (("main", main), ("reject", reject)):
            with urllib.request.urlopen(handle.metrics, timeout=5) as resp:
                exposition = resp.read()
            assert b"candidate_scheduler_groups_received_total" in exposition
            check = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
            assert check.returncode == 0, (
                f"promtool check metrics failed on the {name} scheduler's exposition (rc {check.returncode}):\n"
                f"{check.stdout.decode()}{check.stderr.decode()}"
            )

        # 2. Every dashboard query, and the load, through Prometheus; poll until all hold or the deadline.
        deadline = time.monotonic() + QUERY_DEADLINE_S
        while True:
            assert load.error is None, f"load failed: {load.error!r}"
            failures = []
            for dash, panel, _expr, promql in expanded:
                samples = prom.query(promql)
                if not samples:
                    failures.append(f"{dash} / {panel}: no samples: {promql}")
                elif all(math.isnan(v) for _labels, v in samples):
                    failures.append(f"{dash} / {panel}: only NaN ({len(samples)} series): {promql}")
            for what, promql in LOAD_VISIBLE:
                samples = prom.query(promql)
                if not samples or not any(v > 0 for _labels, v in samples):
                    failures.append(f"load not visible ({what}): {promql} -> {samples}")
            if not failures:
                break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{len(failures)} of {len(expanded)} dashboard queries (+{len(LOAD_VISIBLE)} load checks) "
                    f"returned no data after {QUERY_DEADLINE_S:.0f} s of load ({load.rounds} rounds):\n  "
                    + "\n  ".join(failures)
                )
            time.sleep(SCRAPE_INTERVAL_S)
    finally:
        load.stop_event.set()
        load.join(timeout=30)
        prom.stop()
    assert load.error is None, f"load failed: {load.error!r}"
