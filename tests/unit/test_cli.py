"""Every flag of every subcommand says what it does and what its default is."""

import argparse

import pytest

from candidate_scheduler.cli import build_parser


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_flag_has_help_with_its_default(name):
    sub = _subparsers()[name]
    text = sub.format_help()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 3, f"{name} {action.option_strings or action.dest}: no help"
        if action.option_strings:
            assert action.default is argparse.SUPPRESS or "(default:" in sub._get_formatter()._expand_help(action), \
                f"{name} {action.option_strings}: help does not show the default"
    if any(a.option_strings and not isinstance(a, argparse._HelpAction) for a in sub._actions):
        assert "(default:" in text


def test_submit_parses_the_new_request_forms():
    args = build_parser().parse_args(["submit", "--seeds", "3,5,7", "--rollout", "--return-step-indices", "0,2",
                                      "--domain-name", "droid_lerobot", "--min-count", "2", "--image", "a.png",
                                      "--image", "b.png"])
    assert args.seeds == [3, 5, 7] and args.rollout and args.return_step_indices == [0, 2]
    assert args.domain_name == "droid_lerobot" and args.min_count == 2 and args.image == ["a.png", "b.png"]


def test_bench_hands_its_flags_to_the_benchmark(monkeypatch):
    # argparse.REMAINDER alone rejects `bench --smoke`; CI caught it once.
    from candidate_scheduler import cli, commands

    seen = []
    monkeypatch.setattr(commands, "cmd_bench", lambda args: seen.append(args.bench_args) or 0)
    assert cli.main(["bench", "--smoke", "--model", "m", "--out", "o"]) == 0
    assert cli.main(["bench", "--", "--load"]) == 0
    assert seen == [["--smoke", "--model", "m", "--out", "o"], ["--", "--load"]]


def test_serve_passes_the_deadline_margin_quantile_to_the_engine():
    from candidate_scheduler.commands import _config

    config = _config(build_parser().parse_args(["serve", "--deadline-margin-quantile", "0.97"]))
    assert config.engine.margin_quantile == 0.97
    assert _config(build_parser().parse_args(["serve"])).engine.margin_quantile == 0.9
    with pytest.raises(SystemExit):  # argparse's own error: "must be between 0.5 and 1"
        build_parser().parse_args(["serve", "--deadline-margin-quantile", "2"])


def test_the_benchmark_refuses_a_bad_deadline_margin_quantile_as_serve_does():
    from candidate_scheduler.bench.cli import build_parser as bench_parser

    assert bench_parser().parse_args(["--deadline", "--deadline-margin-quantile", "0.95"]).deadline_margin_quantile == 0.95
    with pytest.raises(SystemExit):
        bench_parser().parse_args(["--deadline", "--deadline-margin-quantile", "0.2"])


def test_call_rows_is_checked_when_parsed_and_handed_to_the_workers_up_starts():
    from candidate_scheduler.commands import worker_flags

    assert build_parser().parse_args(["worker"]).call_rows == "auto"
    assert build_parser().parse_args(["worker", "--call-rows", "all"]).call_rows == "all"
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", "--call-rows", bad])
    flags = worker_flags(build_parser().parse_args(["up", "--call-rows", "2"]))
    assert flags[flags.index("--call-rows") + 1] == "2"


def test_graces_are_finite_and_not_negative():
    """A NaN or infinite grace would never run out: the stop would end only by the orchestrator's SIGKILL."""
    assert build_parser().parse_args(["serve"]).stop_grace_s == 25.0
    assert build_parser().parse_args(["serve", "--stop-grace-s", "0"]).stop_grace_s == 0.0
    assert build_parser().parse_args(["worker", "--leave-grace-s", "2.5"]).leave_grace_s == 2.5
    for command, flag in (("serve", "--stop-grace-s"), ("up", "--stop-grace-s"), ("worker", "--leave-grace-s")):
        for bad in ("nan", "inf", "-1", "soon"):
            with pytest.raises(SystemExit):
                build_parser().parse_args([command, flag, bad])


def test_the_bridge_refuses_a_liveness_or_an_in_flight_cap_that_cannot_work():
    """A liveness of 0 or NaN would PING at once or never; a cap below 1 would answer every request busy."""
    from candidate_scheduler.compat.bridge import build_parser as bridge_parser

    args = bridge_parser().parse_args(["--liveness", "0.5", "--max-in-flight", "8"])
    assert (args.liveness, args.max_in_flight) == (0.5, 8)
    for flag, bad in (("--liveness", "0"), ("--liveness", "nan"), ("--liveness", "-1"), ("--max-in-flight", "0"),
                      ("--max-in-flight", "many")):
        with pytest.raises(SystemExit):
            bridge_parser().parse_args([flag, bad])
