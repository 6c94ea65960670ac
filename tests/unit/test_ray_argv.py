"""`up --ray` hands its own command line on to `serve` (ray_placement.serve_argv) without the flags that
are the workers' or Ray's: every one of them, or the scheduler actor's `serve` refuses the command line
and the service never starts (`--call-rows all`, which docs/deployment.md recommends for throughput on
CUDA, was passed on)."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("ray", reason="ray_placement needs Ray")

from candidate_scheduler import cli  # noqa: E402
from candidate_scheduler.service.ray_placement import serve_argv  # noqa: E402

# a value each flag takes (any other flag takes a number)
VALUES = {"--ray": "auto", "--placement": "PACK", "--adapter": "null", "--device": "cpu", "--model": "/m",
          "--call-rows": "all", "--conditioning": "inline", "--warmup-shapes": "64x64"}


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_every_flag_of_up_that_serve_lacks_stays_off_serves_command_line():
    up_only = sorted(_flags(_subparser("up")) - _flags(_subparser("serve")))
    assert "--call-rows" in up_only and "--workers" in up_only  # the test sees the flags it means to
    for flag in up_only:
        for argv in (["up", flag, VALUES.get(flag, "2"), "--request-port", "7000"],
                     ["up", f"{flag}={VALUES.get(flag, '2')}", "--request-port", "7000"]):
            out = serve_argv(argv)
            assert out == ["--request-port", "7000"], (argv, out)
            _subparser("serve").parse_args(out)  # serve takes what is left (SystemExit otherwise)


def test_the_scheduler_flags_go_through_with_their_values():
    argv = ["up", "--ray", "auto", "--call-rows", "all", "--workers", "2", "--stop-grace-s", "5", "--no-compat",
            "--host", "0.0.0.0"]
    assert serve_argv(argv) == ["--stop-grace-s", "5", "--no-compat", "--host", "0.0.0.0"]


def test_the_client_keys_are_found_whichever_way_the_key_directory_is_given(tmp_path):
    """`up --ray ... --curve-dir=DIR`: without the admin's keys the driver's STATS never reach the scheduler,
    and `up` waited out its five minutes for workers that had registered long before."""
    from candidate_scheduler.service import keys
    from candidate_scheduler.service.ray_placement import _keys_of

    keys.init_dir(tmp_path / "k")
    expected = keys.ClientKeys.load(str(tmp_path / "k"), "admin").to_env()
    assert _keys_of(["--curve-dir", str(tmp_path / "k")], "admin") == expected
    assert _keys_of([f"--curve-dir={tmp_path / 'k'}"], "admin") == expected
    # as argparse reads it: the last one given wins
    assert _keys_of(["--curve-dir", "/nowhere", "--no-compat", f"--curve-dir={tmp_path / 'k'}"], "admin") == expected
    assert _keys_of(["--no-compat"], "admin") is None


def _up_ray(tmp_path, *prelude: str):
    import subprocess
    import sys

    from candidate_scheduler.service.launcher import ROOT, child_env

    # RAY_TMPDIR: a Ray session directory of its own, so `auto` finds no cluster whatever else runs here
    env = {**child_env(), "RAY_TMPDIR": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    code = "\n".join([*prelude, "import sys; from candidate_scheduler import cli",
                      "sys.exit(cli.main(['up', '--ray', 'auto', '--adapter', 'null', '--no-compat']))"])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_up_on_an_absent_ray_cluster_says_so_in_one_line(tmp_path):
    out = _up_ray(tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "candidate-scheduler up: error: no Ray cluster" in out.stderr and "ray start --head" in out.stderr


def test_up_ray_without_ray_installed_says_how_to_install_it(tmp_path):
    out = _up_ray(tmp_path, "import sys; sys.modules['ray'] = None  # as if Ray were not installed")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "candidate-scheduler[ray]" in out.stderr


def test_a_wildcard_endpoint_is_reached_at_the_nodes_address_and_nothing_else_is_rewritten():
    from candidate_scheduler.service.ray_placement import reachable_at

    assert reachable_at("tcp://0.0.0.0:5555", "10.1.2.3") == "tcp://10.1.2.3:5555"
    assert reachable_at("tcp://*:5555", "10.1.2.3") == "tcp://10.1.2.3:5555"
    # a host that merely contains the wildcard's text stays as it is (str.replace made it tcp://110.1.2.3:5555)
    assert reachable_at("tcp://10.0.0.0:5555", "10.1.2.3") == "tcp://10.0.0.0:5555"
    assert reachable_at("tcp://127.0.0.1:5555", "10.1.2.3") == "tcp://127.0.0.1:5555"


def test_up_takes_no_abbreviated_flag_that_serve_would_then_refuse():
    from candidate_scheduler.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["up", "--call-rows", "all"]).call_rows == "all"
    with pytest.raises(SystemExit):  # `--call` would reach `serve` under --ray, which has no such flag
        parser.parse_args(["up", "--call", "all"])
