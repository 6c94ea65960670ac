"""A key directory another user owns is theirs to write, whatever its mode bits say.

`Directory.load` refuses a directory or record every user may write (test_key_dir_permissions.py). An
attacker on the host gets the same by owning the directory: `mkdir /tmp/keys` (mode 0755, not
world-writable) before the operator runs `candidate-scheduler keys /tmp/keys`, then drop (or swap in) an
`authorized_tokens/` record of their own, role admin. So the scheduler and the fronts refuse a key
directory or record owned by anyone but this user or root (a read-only mount stays exempt), and `keys`
refuses to write into a directory another user owns (its files could be pre-planted links)."""

from __future__ import annotations

import json
import os

import pytest

from candidate_scheduler.service import keys
from candidate_scheduler.service.keys import Directory, KeyDirError, add_token, init_dir, load_tokens

MALLORY = 54321  # a uid that is not this process's, nor root's


def _give_to_mallory(monkeypatch, *paths) -> None:
    """`paths` owned by another user: chown as root; else this user poses as another (geteuid)."""
    if os.geteuid() == 0:
        for path in paths:
            os.chown(path, MALLORY, -1)
    else:
        real = os.geteuid()
        monkeypatch.setattr(keys.os, "geteuid", lambda: real + 1)


def _mallory_admin_token(d) -> str:
    token = "a-token-mallory-chose"
    (d / "authorized_tokens" / "mallory.json").write_text(
        json.dumps({"sha256": keys._digest(token), "role": "admin", "tenant": "default"}))
    return token


def test_an_admin_token_dropped_into_a_directory_another_user_owns_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "keys"
    init_dir(d)
    add_token(d, "arm", "client", "robots")
    token = _mallory_admin_token(d)
    _give_to_mallory(monkeypatch, d / "authorized_tokens", d / "authorized_tokens" / "mallory.json")
    assert not os.stat(d / "authorized_tokens").st_mode & 0o002  # no world-writable bit to catch it by
    with pytest.raises(KeyDirError, match="owned by uid"):
        Directory.load(d)
    with pytest.raises(KeyDirError, match="owned by uid"):
        load_tokens(str(d))  # what a front's --tokens reads
    assert token  # before: loaded, and Directory.for_token(token) was mallory, an admin


def test_a_key_directory_another_user_made_first_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "keys"
    d.mkdir(mode=0o755)
    _give_to_mallory(monkeypatch, d)
    with pytest.raises(KeyDirError, match="owned by uid"):
        init_dir(d)  # `candidate-scheduler keys DIR`: nothing written into it
    assert not any(d.iterdir())
    with pytest.raises(KeyDirError, match="owned by uid"):
        add_token(d, "arm")


def test_this_users_and_a_read_only_mounts_directories_load(tmp_path, monkeypatch):
    d = tmp_path / "keys"
    init_dir(d)
    add_token(d, "arm", "client", "robots")
    assert Directory.load(d).get("arm").tenant == "robots"
    _give_to_mallory(monkeypatch, d, d / "authorized_tokens", d / "authorized_tokens" / "arm.json")
    real = os.statvfs

    class ReadOnly:  # nobody writes a read-only mount, whoever its files say they belong to
        def __init__(self, path):
            self.f_flag = real(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(keys.os, "statvfs", ReadOnly)
    assert Directory.load(d).get("arm").tenant == "robots"
