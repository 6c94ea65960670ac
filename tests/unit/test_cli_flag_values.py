"""Flags that take a value the service cannot serve with are refused when parsed, in argparse's one line,
and a port the metrics server cannot take is one line too, not a traceback."""

import socket

import pytest

from candidate_scheduler.cli import build_parser


@pytest.mark.parametrize("argv", [
    ["serve", "--request-port", "70000"],  # ZMQ took it as 70000 % 65536 = 4464 and listened there
    ["serve", "--worker-port", "-5"],
    ["serve", "--metrics-port", "70000"],  # an OverflowError traceback from the metrics server
    ["serve", "--metrics-port", "-2"],
    ["serve", "--max-queued-groups", "-1"],  # every group 'overloaded'
    ["serve", "--max-queued-groups", "0"],
    ["serve", "--retry-limit", "0"],  # no attempt at all
    ["serve", "--heartbeat-interval", "nan"],
    ["serve", "--heartbeat-timeout", "0"],  # every worker dead at once
    ["serve", "--best-effort-slack", "nan"],  # earliest-deadline-first over NaN due times
    ["serve", "--prefetch-lead", "nan"],  # a ValueError traceback from EngineConfig
    ["serve", "--prefetch-lead", "-1"],
    ["up", "--workers", "-1"],  # silently no worker
    ["up", "--capacity", "-3"],
    ["worker", "--capacity", "0"],
    ["worker", "--scheduler", "tcp://127.0.0.1"],  # a ZMQError traceback once the model had loaded
    ["worker", "--scheduler", "127.0.0.1:5557"],
    ["worker", "--scheduler", "tcp://127.0.0.1:0"],
    ["worker", "--conditioning-cache-mb", "nan"],
    ["worker", "--memory-budget-mb", "-1"],
    ["worker", "--step-delay", "inf"],
    ["demo", "--count", "0"],
    ["demo", "--request-port", "0"],  # the demo's client would dial port 0
    ["demo", "--metrics-port", "99999"],
    ["demo", "--metrics-port", "0"],  # printed http://127.0.0.1:0/metrics, where nothing listens
    ["submit", "--request-port", "0"],
    ["http", "--http-port", "65536"],
])
def test_a_value_the_service_cannot_serve_with_is_refused_when_parsed(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"argument {argv[1]}" in capsys.readouterr().err


def test_the_values_that_work_still_parse():
    args = build_parser().parse_args(["serve", "--request-port", "0", "--metrics-port", "-1", "--prefetch-lead", "inf",
                                      "--retry-limit", "1", "--best-effort-slack", "0"])
    assert (args.request_port, args.metrics_port, args.prefetch_lead, args.retry_limit) == (0, -1, float("inf"), 1)
    assert build_parser().parse_args(["up", "--workers", "0"]).workers == 0  # a scheduler for remote workers
    assert build_parser().parse_args(["worker", "--capacity", "4"]).capacity == 4
    for endpoint in ("tcp://10.0.0.1:5557", "tcp://[::1]:5557", "tcp://sched.local:5557", "ipc:///tmp/w"):
        assert build_parser().parse_args(["worker", "--scheduler", endpoint]).scheduler == endpoint
    assert build_parser().parse_args(["demo", "--metrics-port", "-1"]).metrics_port == -1


def test_a_metrics_port_in_use_is_one_line_not_a_traceback():
    from candidate_scheduler.commands import _config, _start_metrics
    from candidate_scheduler.service.server import StartupRefused

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(build_parser().parse_args(["serve", "--metrics-port", str(port)]))
        with pytest.raises(StartupRefused, match=f"cannot serve /metrics on 127.0.0.1:{port}"):
            _start_metrics(config, [])


@pytest.mark.parametrize("value", ["70000", "-3", "x"])
def test_the_openpi_port_is_a_port(value, capsys):
    from candidate_scheduler import cli

    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["serve", "--openpi-port", value])
    assert exc.value.code == 2 and "--openpi-port" in capsys.readouterr().err


@pytest.mark.parametrize("interval, timeout", [("3", "3"), ("5", "3")])
def test_a_heartbeat_interval_not_below_the_timeout_is_one_line_before_anything_binds(interval, timeout, capsys):
    # each parses alone; together every worker would be taken for dead between its beats, again and again
    from candidate_scheduler.cli import main

    assert main(["serve", "--heartbeat-interval", interval, "--heartbeat-timeout", timeout, "--request-port", "0",
                 "--control-port", "0", "--worker-port", "0", "--metrics-port", "-1", "--no-compat"]) == 2
    err = capsys.readouterr().err
    assert "heartbeat interval" in err and "below the heartbeat timeout" in err and "Traceback" not in err
