"""deploy/kubernetes: every manifest valid against Kubernetes 1.37's schemas (kubernetes-validate, pinned
in the lock, with its bundled schemas: no network), strictly (an unknown field fails); and consistent
with each other and with the CLI: the ports the scheduler binds are the ones its Service routes, the
workers dial the Service's worker port, every Secret mounted exists, the workers ask for a GPU, and
Prometheus scrapes the Service's metrics port."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

from candidate_scheduler.cli import build_parser  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
K8S = "1.37.0"


def _docs() -> list[dict]:
    return [d for path in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def _one(kind: str, name: str) -> dict:
    [doc] = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_every_manifest_is_valid_strictly_and_an_unknown_field_is_not():
    docs = _docs()
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "Secret", "ConfigMap"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)
    broken = _one("Deployment", "candidate-scheduler")
    broken["spec"]["replicass"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S, strict=True)


def _args(deployment: str) -> tuple[list[str], dict]:
    container = _one("Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    return container["args"], container


def test_the_manifests_agree_with_each_other_and_with_the_cli():
    parser = build_parser()
    sched_args, sched = _args("candidate-scheduler")
    serve = parser.parse_args(sched_args)  # flags the CLI really has
    assert serve.curve_dir and serve.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in sched["ports"]}
    assert ports == {"request": serve.request_port, "control": serve.control_port, "workers": serve.worker_port,
                     "metrics": serve.metrics_port}
    service = _one("Service", "candidate-scheduler")
    routed = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert {name: port for name, (port, _t) in routed.items()} == ports
    assert all(target in ports for _p, target in routed.values())
    labels = _one("Deployment", "candidate-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()

    # an upgrade's SIGTERM: the scheduler serves what it admitted before the kubelet's SIGKILL comes
    sched_pod = _one("Deployment", "candidate-scheduler")["spec"]["template"]["spec"]
    assert 0 < serve.stop_grace_s < sched_pod["terminationGracePeriodSeconds"] - 5

    worker_args, worker = _args("candidate-scheduler-worker")
    w = parser.parse_args(worker_args)
    assert w.scheduler == f"tcp://{service['metadata']['name']}:{ports['workers']}" and w.curve_dir
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1" and w.device == "cuda"
    # a rolling update's SIGTERM: the worker finishes what it holds before the kubelet's SIGKILL comes
    pod = _one("Deployment", "candidate-scheduler-worker")["spec"]["template"]["spec"]
    assert 0 < w.leave_grace_s < pod["terminationGracePeriodSeconds"] - 5

    secrets = {d["metadata"]["name"] for d in _docs() if d["kind"] == "Secret"}
    for name in ("candidate-scheduler", "candidate-scheduler-worker"):
        volumes = _one("Deployment", name)["spec"]["template"]["spec"]["volumes"]
        assert {v["secret"]["secretName"] for v in volumes if "secret" in v} <= secrets
    mounts = {m["mountPath"] for m in sched["volumeMounts"]}
    assert {serve.curve_dir, f"{serve.curve_dir}/authorized_clients", f"{serve.curve_dir}/authorized_tokens"} <= mounts

    scrape = yaml.safe_load(_one("ConfigMap", "candidate-scheduler-prometheus")["data"]["prometheus.yml"])
    [target] = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert target == f"{service['metadata']['name']}:{ports['metrics']}"


def test_the_scrape_config_is_one_prometheus_accepts(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (make test installs Debian's prometheus)")
    config = tmp_path / "prometheus.yml"
    config.write_text(_one("ConfigMap", "candidate-scheduler-prometheus")["data"]["prometheus.yml"])
    out = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
