"""`candidate-scheduler demo` (`make run`) as a user meets it, with the service and its client faked: what it
does to the --model directory, and what its exit code says."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import numpy as np
import pytest

from candidate_scheduler import cli, commands


class _Started(Exception):
    """The demo got as far as starting the service."""


@pytest.fixture
def no_signals(monkeypatch):
    monkeypatch.setattr(commands.signal, "signal", lambda *a: None)  # the demo's SIGTERM handler stays out of pytest


def _refuse_to_start(monkeypatch):
    real = commands.subprocess.Popen

    def popen(cmd, *a, **kw):
        if "candidate_scheduler.cli" not in cmd:  # the imports behind a checkpoint write start processes too
            return real(cmd, *a, **kw)
        raise _Started(cmd)

    monkeypatch.setattr(commands.subprocess, "Popen", popen)


def test_demo_never_replaces_a_directory_that_is_not_a_tiny_checkpoint(tmp_path, monkeypatch, no_signals):
    """`demo --model DIR` wrote the tiny checkpoint over any DIR without its manifest (a real Cosmos3
    checkpoint, a full preset's config-only plan, a user's home): shutil.rmtree, then the random weights."""
    model = tmp_path / "my-cosmos3"
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    (model / "precious.safetensors").write_bytes(b"weights")
    _refuse_to_start(monkeypatch)
    with pytest.raises(_Started):
        cli.main(["demo", "--once", "--model", str(model)])
    assert (model / "precious.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in model.iterdir()) == ["model_index.json", "precious.safetensors"]


def test_demo_writes_the_tiny_checkpoint_where_there_is_none_and_refuses_a_file(tmp_path, monkeypatch, no_signals,
                                                                               capsys):
    written = []
    monkeypatch.setattr("candidate_scheduler.worker.tiny_checkpoint.ensure_checkpoint", written.append)
    _refuse_to_start(monkeypatch)
    for model in (tmp_path / "missing", tmp_path / "empty"):
        if model.name == "empty":
            model.mkdir()
        with pytest.raises(_Started):
            cli.main(["demo", "--once", "--model", str(model)])
    old = tmp_path / "old-tiny"
    old.mkdir()
    (old / "tiny_checkpoint.json").write_text('{"format_version": 0}')  # an older tiny one of ours: rewritten
    with pytest.raises(_Started):
        cli.main(["demo", "--once", "--model", str(old)])
    assert [p.name for p in written] == ["missing", "empty", "old-tiny"]
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"x")
    assert cli.main(["demo", "--once", "--model", str(a_file)]) == 2
    assert "is a file, not a checkpoint directory" in capsys.readouterr().err
    assert a_file.read_bytes() == b"x"


class _FakeService:
    def __init__(self, wait_code=0, wait_raises=None):
        self.wait_code, self.wait_raises, self.signals = wait_code, wait_raises, []
        self.returncode = None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if self.wait_raises is not None:
            exc, self.wait_raises = self.wait_raises, None
            raise exc
        self.returncode = self.wait_code
        return self.wait_code

    def send_signal(self, sig):
        self.signals.append(sig)
        self.returncode = -sig


class _FakeClient:
    def __init__(self, *a, submit_raises=None, **kw):
        self.submit_raises = submit_raises

    def stats(self):
        return {"workers": ["w0"]}

    def submit(self, *a, **kw):
        if self.submit_raises is not None:
            raise self.submit_raises
        return SimpleNamespace(request_id="g", status="done", ok=True, candidates=np.zeros((8, 16, 7)),
                               candidate_seeds=list(range(8)), action=np.zeros((16, 7)), metrics={})

    def close(self):
        pass


def _demo(monkeypatch, tmp_path, service, *argv, submit_raises=None) -> int:
    monkeypatch.setattr("candidate_scheduler.worker.tiny_checkpoint.ensure_checkpoint", lambda path: path)
    monkeypatch.setattr(commands.subprocess, "Popen", lambda cmd, **kw: service)
    monkeypatch.setattr("candidate_scheduler.service.client.Client",
                        lambda *a, **kw: _FakeClient(submit_raises=submit_raises))
    return cli.main(["demo", "--model", str(tmp_path / "m"), *argv])


def test_demo_fails_when_the_service_dies_while_serving(tmp_path, monkeypatch, no_signals, capsys):
    """The service dying after the demo group (a crash, the OOM killer) ended `make run` with 0."""
    assert _demo(monkeypatch, tmp_path, _FakeService(wait_code=1)) == 1
    assert "the service exited with code 1" in capsys.readouterr().err


def test_ctrl_c_while_serving_is_a_clean_stop_but_not_before_the_group_is_answered(tmp_path, monkeypatch, no_signals):
    """A SIGTERM (a CI runner's timeout) or Ctrl-C before the demo group was answered ended `demo --once` with 0,
    as if it had passed."""
    service = _FakeService(wait_raises=KeyboardInterrupt())
    assert _demo(monkeypatch, tmp_path, service) == 0  # serving, then Ctrl-C: the way to stop it
    assert service.signals == [signal.SIGINT]
    service = _FakeService()
    assert _demo(monkeypatch, tmp_path, service, "--once", submit_raises=KeyboardInterrupt()) == 130
    assert service.signals == [signal.SIGINT]  # and `up` is stopped either way


def test_demo_says_metrics_are_off_instead_of_printing_an_address_nothing_listens_on(tmp_path, monkeypatch,
                                                                                     no_signals, capsys):
    assert _demo(monkeypatch, tmp_path, _FakeService(), "--once", "--metrics-port", "-1") == 0
    out = capsys.readouterr().out
    assert "metrics: off" in out and ":-1/metrics" not in out


def test_the_submit_hint_dials_the_ports_the_demo_bound(tmp_path, monkeypatch, no_signals, capsys):
    """`demo --request-port 6001` printed a `submit` hint without ports: it dialled 5555, another service or none."""
    assert _demo(monkeypatch, tmp_path, _FakeService(), "--once", "--request-port", "6001", "--control-port", "6002") == 0
    hint = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("try:"))
    assert hint.endswith("submit --count 8 --reducer medoid --synthetic --request-port 6001 --control-port 6002")
    assert cli.build_parser().parse_args(hint.split("candidate-scheduler ", 1)[1].split()).request_port == 6001
    assert _demo(monkeypatch, tmp_path, _FakeService(), "--once") == 0
    assert "medoid --synthetic\n" in capsys.readouterr().out  # the defaults: nothing to add
