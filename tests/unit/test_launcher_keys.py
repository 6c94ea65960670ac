"""Launcher.scheduler gives its handle the admin keys of the key directory `serve` was started with, wherever
the --curve-dir came from."""

from __future__ import annotations

import subprocess
import sys

from candidate_scheduler.service import launcher as launcher_mod
from candidate_scheduler.service.keys import ClientKeys


class _FakeServe:
    lines = ["candidate-scheduler: request endpoint  tcp://127.0.0.1:1\n",
             "candidate-scheduler: control endpoint  tcp://127.0.0.1:2\n",
             "candidate-scheduler: worker link       tcp://127.0.0.1:3\n",
             "candidate-scheduler: metrics           off\n",
             "candidate-scheduler: sglang compat     off\n"]

    def __init__(self, cmd):
        self.cmd = cmd

    def wait_line(self, pattern, timeout_s):
        return next(m for line in self.lines if (m := pattern.search(line)))


def _keys(tmp_path, name):
    d = tmp_path / name
    subprocess.run([sys.executable, "-m", "candidate_scheduler.cli", "keys", str(d)], check=True, capture_output=True)
    return d


def test_a_key_directory_given_in_serve_args_gives_the_handle_its_admin_keys(tmp_path, monkeypatch):
    """--curve-dir in the Launcher's serve_args (every `serve` of a test module) left the handle keyless: its
    client's STATS went unanswered by a scheduler that takes only keys, and wait_workers timed out."""
    first, second = _keys(tmp_path, "a"), _keys(tmp_path, "b")
    started = []
    with launcher_mod.Launcher(tmp_path / "logs", serve_args=("--curve-dir", str(first))) as launcher:
        monkeypatch.setattr(launcher, "start", lambda cmd, name, cls=None: started.append(cmd) or _FakeServe(cmd))
        monkeypatch.setattr(launcher, "procs", [])
        handle = launcher.scheduler()
        assert handle.keys is not None
        assert handle.keys.server_public == ClientKeys.load(first).server_public
        later = launcher.scheduler("--curve-dir", str(second))  # a later flag wins, as in argparse
        assert later.keys.server_public == ClientKeys.load(second).server_public
        assert launcher.scheduler().keys.public == ClientKeys.load(first).public
