"""The control commands (stats, cancel, status, drain, shutdown, worker-leave) with no scheduler to answer."""

from __future__ import annotations

import pytest

from candidate_scheduler import cli, commands


class _Silent:
    def __init__(self, exc):
        self.exc = exc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        def call(*a, **kw):
            raise self.exc
        return call


@pytest.mark.parametrize("argv", [["stats"], ["cancel", "g1"], ["status", "g1"], ["drain"], ["shutdown"],
                                  ["worker-leave", "w1"]])
def test_no_scheduler_is_one_line_and_exit_code_4_not_a_traceback(argv, monkeypatch, capsys):
    """`candidate-scheduler stats` with no scheduler listening ended in a TimeoutError traceback."""
    from candidate_scheduler.service.client import SchedulerUnavailable

    for exc in (TimeoutError("no control reply to STATS"), SchedulerUnavailable("no PONG within 6 s")):
        monkeypatch.setattr(commands, "_client", lambda args, exc=exc: _Silent(exc))
        assert cli.main([*argv, "--control-port", "6556"]) == 4
        err = capsys.readouterr().err
        assert err.startswith(f"candidate-scheduler {argv[0]}: scheduler unavailable at 127.0.0.1 (control port 6556)")
        assert err.count("\n") == 1
