"""`worker` and `up` refuse a checkpoint, a key directory or warm-up shapes they cannot use in one line,
before the model loads (or the scheduler binds), not as a traceback after."""

from __future__ import annotations

import pytest

from candidate_scheduler import cli, commands


@pytest.fixture
def no_signals(monkeypatch):
    monkeypatch.setattr(commands.signal, "signal", lambda *a: None)


def test_a_worker_with_a_key_directory_it_cannot_read_says_so_in_one_line(tmp_path, no_signals, capsys):
    """pyzmq's OSError traceback came at connect, after the model loaded and warmed up."""
    code = cli.main(["worker", "--adapter", "null", "--curve-dir", str(tmp_path / "no-keys"),
                     "--scheduler", "tcp://127.0.0.1:1", "--warmup-shapes", ""])
    assert code == 2
    err = capsys.readouterr().err
    assert f"candidate-scheduler worker: error: cannot read the keys of 'worker' in {tmp_path / 'no-keys'}" in err
    assert "Traceback" not in err


def test_a_worker_without_its_checkpoint_says_so_in_one_line(tmp_path, no_signals, capsys, monkeypatch):
    """sglang took the missing directory for a Hugging Face repo id and raised a ValueError traceback."""
    import candidate_scheduler.worker.loop as loop

    monkeypatch.setattr(loop, "build_adapter", lambda *a, **kw: pytest.fail("the model was loaded"))
    missing = tmp_path / "tiny-cosmos3"
    assert cli.main(["worker", "--model", str(missing), "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert f"--model {missing} is not a checkpoint directory" in capsys.readouterr().err


def test_up_refuses_a_missing_checkpoint_before_the_scheduler_binds(tmp_path, monkeypatch, capsys):
    """`up` served on with a scheduler whose workers had all died at start (and `demo` waited 180 s for them)."""
    monkeypatch.setattr(commands, "_serve", lambda *a, **kw: pytest.fail("the scheduler started"))
    missing = tmp_path / "nothing-here"
    assert cli.main(["up", "--model", str(missing)]) == 2
    assert "is not a checkpoint directory" in capsys.readouterr().err
    up = cli.build_parser().parse_args(["up", "--model", str(missing), "--workers", "0"])
    started = []
    monkeypatch.setattr(commands, "_serve", lambda *a, **kw: started.append(a))
    assert commands.cmd_up(up) == 0 and started  # no local worker: nothing to check


@pytest.mark.parametrize("bad", ["64by64", "64", "0x64", "x"])
def test_warmup_shapes_are_checked_before_the_model_loads(bad, monkeypatch, capsys):
    """A ValueError traceback from the worker, after the model loaded; under `up`, workers that died at start."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["worker", "--warmup-shapes", bad])
    monkeypatch.setattr(commands, "_serve", lambda *a, **kw: pytest.fail("the scheduler started"))
    assert cli.main(["up", "--adapter", "null", "--warmup-shapes", bad]) == 2
    assert "candidate-scheduler up: error: --warmup-shapes: " in capsys.readouterr().err
    assert cli.build_parser().parse_args(["worker", "--warmup-shapes", "64x64, 256x256"]).warmup_shapes
    assert cli.build_parser().parse_args(["worker", "--warmup-shapes", ""]).warmup_shapes == ""
