"""Client keys as a program holds them: read from a key directory named from the home directory, as
docs/deployment.md shows it from Python (`ClientKeys.load("~/keys", "trainer")`; the shell expands `~`
on a command line, Python does not), and never showing the secret key in a repr (logs, tracebacks,
the repr of a dataclass that holds them, a test report)."""

from __future__ import annotations

import zmq

from candidate_scheduler.service.keys import ClientKeys, Directory, add_key, add_token, init_dir, load_tokens


def test_a_key_directory_under_home_loads_as_documented(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    init_dir(tmp_path / "keys")
    add_key(tmp_path / "keys", "trainer", "client", "rl")
    add_token(tmp_path / "keys", "robot1", "client", "robots")
    keys = ClientKeys.load("~/keys", "trainer")
    assert keys.server_public == ClientKeys.load(tmp_path / "keys", "trainer").server_public
    assert Directory.load("~/keys").get("trainer").tenant == "rl"
    assert load_tokens("~/keys").get("robot1").tenant == "robots"


def test_keys_writes_under_home_not_into_a_directory_named_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    init_dir("~/keys")
    add_token("~/keys", "robot1")
    assert not (tmp_path / "~").exists()
    assert (tmp_path / "home" / "keys" / "robot1.token").exists()


def test_client_keys_never_show_the_secret_key():
    server_public, _ = zmq.curve_keypair()
    k = ClientKeys.ephemeral(server_public)
    assert k.secret.decode() not in repr(k) and k.secret.decode() not in str(k)
    assert k.public.decode() in repr(k)  # still says whose keys they are
    assert ClientKeys.from_env(k.to_env()) == k  # the environment hand-over keeps the secret
