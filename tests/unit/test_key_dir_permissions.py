"""Who may change a key directory decides who the scheduler trusts: whoever can write
`authorized_clients/` or `authorized_tokens/` can authorise an admin key or a token of their own. So
`keys` never writes a directory or a record other users may write, whatever the caller's umask, and
the scheduler (and a front's `--tokens`) refuses a directory every user, or its group, may write,
unless it sits on a read-only mount (a Kubernetes secret volume)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from candidate_scheduler.core.access import Role
from candidate_scheduler.service import keys
from candidate_scheduler.service.keys import (
    Directory,
    KeyDirError,
    add_key,
    add_token,
    init_dir,
    load_tokens,
)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def permissive_umask():
    old = os.umask(0)  # the most permissive umask a caller could have (002 gives the same to a group)
    try:
        yield
    finally:
        os.umask(old)


def test_keys_writes_nothing_others_may_change_under_any_umask(tmp_path, permissive_umask):
    d = tmp_path / "k"
    init_dir(d)
    add_key(d, "bot", "client", "robots")
    add_token(d, "arm", "client", "robots")
    written = [d, d / "authorized_clients", d / "authorized_tokens",
               *(d / "authorized_clients").iterdir(), *(d / "authorized_tokens").iterdir()]
    assert len(written) == 3 + 3 + 1  # client, admin and bot keys; arm's token
    loose = {str(p.relative_to(tmp_path)): oct(_mode(p)) for p in written if _mode(p) & 0o022}
    assert not loose  # before: the directories 0777 and the records 0666 under umask 0


def test_the_umask_is_given_back(tmp_path):
    old = os.umask(0o027)
    try:
        init_dir(tmp_path / "k")
        add_token(tmp_path / "k", "arm")
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(old)


def _world_writable(path) -> None:
    os.chmod(path, _mode(path) | 0o002)


@pytest.mark.parametrize("where", [".", "authorized_clients", "authorized_tokens",
                                   "authorized_clients/admin.key", "authorized_tokens/arm.json"])
def test_a_key_directory_every_user_may_write_is_refused(tmp_path, where):
    init_dir(tmp_path)
    add_token(tmp_path, "arm", "client", "robots")
    Directory.load(tmp_path)  # as written: loads
    _world_writable(tmp_path / where)
    with pytest.raises(KeyDirError, match="writable by every user"):
        Directory.load(tmp_path)
    with pytest.raises(KeyDirError, match="writable by every user"):
        load_tokens(str(tmp_path))  # what a front's --tokens reads


@pytest.mark.parametrize("where", [".", "authorized_tokens", "authorized_clients/admin.key"])
def test_a_key_directory_its_group_may_write_is_refused(tmp_path, where):
    init_dir(tmp_path)
    add_token(tmp_path, "arm", "client", "robots")
    os.chmod(tmp_path / where, _mode(tmp_path / where) | 0o020)  # a umask-002 `mkdir`, or a `chmod g+w`
    with pytest.raises(KeyDirError, match="writable by its group"):
        Directory.load(tmp_path)
    with pytest.raises(KeyDirError, match="writable by its group"):
        load_tokens(str(tmp_path))


def test_the_attack_a_writable_directory_lets_in(tmp_path):
    """What the refusal prevents: another local user drops a token record of their own, as an admin."""
    init_dir(tmp_path)
    add_token(tmp_path, "arm", "client", "robots")
    os.chmod(tmp_path / "authorized_tokens", 0o1777)  # sticky: others still create new records in it
    mine = "a-token-another-user-chose"
    (tmp_path / "authorized_tokens" / "mallory.json").write_text(
        json.dumps({"sha256": keys._digest(mine), "role": "admin", "tenant": "default"}))
    with pytest.raises(KeyDirError, match="authorized_tokens"):
        Directory.load(tmp_path)


def test_a_read_only_mount_with_loose_modes_loads(tmp_path, monkeypatch):
    """A Kubernetes secret volume shows its directory as 1777, but nobody can write it: read-only."""
    init_dir(tmp_path)
    add_token(tmp_path, "arm", "client", "robots")
    os.chmod(tmp_path / "authorized_tokens", 0o1777)
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.f_flag = real(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(keys.os, "statvfs", ReadOnly)
    assert Directory.load(tmp_path).get("arm").tenant == "robots"


def test_a_role_written_is_the_role_loaded(tmp_path):
    init_dir(tmp_path)
    add_key(tmp_path, "ops2", "admin", "default")
    assert Directory.load(tmp_path).get("ops2").role is Role.ADMIN
