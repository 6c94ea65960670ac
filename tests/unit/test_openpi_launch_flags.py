"""The openpi front's size and time flags refuse values it cannot serve with, on its own command line
and on `serve` / `up` (the same flags with an `openpi-` prefix)."""

from __future__ import annotations

import argparse

import pytest

from candidate_scheduler.service.openpi import launch


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    launch.add_openpi_arguments(parser)
    return parser


@pytest.mark.parametrize("flag,value", [("request-timeout", "-1"), ("request-timeout", "0"),
                                        ("request-timeout", "nan"), ("max-frame-bytes", "0"),
                                        ("max-frame-bytes", "-5")])
def test_a_timeout_or_frame_limit_that_cannot_serve_is_refused_at_start(flag, value, capsys):
    # -1 / 0 / nan s: every call answered "no result within -1.0 s" and its group cancelled; a frame limit
    # of 0 silently became 32 MiB, and a negative one refused every frame
    for parser, prefix in ((launch.build_parser(), ""), (_serve_parser(), "openpi-")):
        argv = ["--scheduler-request", "tcp://127.0.0.1:1"] if prefix == "" else []
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([*argv, f"--{prefix}{flag}={value}"])
        assert exc.value.code == 2
        assert f"--{prefix}{flag}" in capsys.readouterr().err


def test_good_values_still_pass():
    args = launch.build_parser().parse_args(["--scheduler-request", "tcp://x:1", "--request-timeout", "2.5",
                                             "--max-frame-bytes", "1000"])
    assert (args.request_timeout, args.max_frame_bytes) == (2.5, 1000)
