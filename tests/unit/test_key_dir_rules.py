"""The key directory `candidate-scheduler keys` writes must stay one the scheduler can load, and must
never silently replace a key already handed out; bad tenant weights are refused at once (a fair-queue
lead must stay a finite number of seconds). Endpoints: an address ZMQ would bind off loopback is never
taken for a loopback one."""

from __future__ import annotations

import math
import os
import stat

import pytest

from candidate_scheduler.core.tenants import TenantPolicy, Tenants
from candidate_scheduler.service.endpoints import is_loopback_endpoint
from candidate_scheduler.service.keys import Directory, KeyDirError, add_key, add_token, init_dir


def _public_of(d, name: str) -> str:
    return (d / "authorized_clients" / f"{name}.key").read_text().split("public-key")[1]


def test_a_name_keeps_one_role_and_tenant_across_keys_and_tokens(tmp_path):
    init_dir(tmp_path)
    add_token(tmp_path, "robot1", "client", "robots")
    with pytest.raises(KeyDirError, match="robot1"):
        add_key(tmp_path, "robot1", "client", "default")  # another tenant: the scheduler would refuse the dir
    with pytest.raises(KeyDirError, match="robot1"):
        add_key(tmp_path, "robot1", "admin", "robots")
    assert not (tmp_path / "robot1.key_secret").exists()
    add_key(tmp_path, "robot1", "client", "robots")  # the same principal: a key beside its token
    add_key(tmp_path, "trainer", "client", "rl")
    with pytest.raises(KeyDirError, match="trainer"):
        add_token(tmp_path, "trainer", "client", "default")
    assert not (tmp_path / "trainer.token").exists()
    directory = Directory.load(tmp_path)  # what the scheduler reads at start: still loads
    assert directory.get("robot1").tenant == "robots" and directory.get("trainer").tenant == "rl"


def test_the_names_serve_gives_its_fronts_are_not_handed_out(tmp_path):
    init_dir(tmp_path)
    for name in ("openpi-front", "sglang-bridge"):
        with pytest.raises(KeyDirError, match=name):
            add_token(tmp_path, name, "client", "default")
        with pytest.raises(KeyDirError, match=name):
            add_key(tmp_path, name, "client", "default")


def test_a_key_handed_out_is_not_replaced_when_its_secret_left_this_host(tmp_path):
    init_dir(tmp_path)
    add_key(tmp_path, "trainer", "client", "rl")
    before = {n: _public_of(tmp_path, n) for n in ("worker", "admin", "trainer")}
    for name in before:  # handed out: the secret moved to the worker hosts, the operator, the trainer
        (tmp_path / f"{name}.key_secret").unlink()
    assert init_dir(tmp_path) == []  # `keys DIR --client bot` runs this first: nothing to write
    with pytest.raises(KeyDirError, match="trainer"):
        add_key(tmp_path, "trainer", "client", "rl")
    assert {n: _public_of(tmp_path, n) for n in before} == before
    assert not any((tmp_path / f"{n}.key_secret").exists() for n in before)


def test_secret_files_are_private(tmp_path):
    os.umask(old := os.umask(0))  # the most permissive umask a caller could have
    try:
        init_dir(tmp_path / "k")
        add_key(tmp_path / "k", "bot", "client", "default")
        add_token(tmp_path / "k", "arm", "client", "default")
    finally:
        os.umask(old)
    for name in ("server.key_secret", "worker.key_secret", "admin.key_secret", "bot.key_secret", "arm.token"):
        mode = stat.S_IMODE((tmp_path / "k" / name).stat().st_mode)
        assert mode & 0o077 == 0, (name, oct(mode))


def test_a_key_directory_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(KeyDirError, match="f"):
        init_dir(tmp_path / "f")


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), 1e-320, 0.0, -1.0, 1e300])
def test_a_weight_that_cannot_give_a_finite_lead_is_refused(weight):
    with pytest.raises(ValueError, match="weight"):
        TenantPolicy("rl", weight=weight)


def test_fair_leads_stay_finite_at_the_extreme_weights_allowed():
    from candidate_scheduler.core.tenants import MAX_WEIGHT, MIN_WEIGHT

    t = Tenants((TenantPolicy("slow", weight=MIN_WEIGHT), TenantPolicy("fast", weight=MAX_WEIGHT)))
    tags = [t.stamp("slow", 64 * 1000 * 4)[0] for _ in range(1000)]  # a long flood of the largest groups
    t.clock.left(tags[-1], started=True)
    for tenant in ("slow", "fast", "other"):
        tag, lead = t.stamp(tenant, 8)
        assert math.isfinite(tag) and math.isfinite(lead), (tenant, tag, lead)


@pytest.mark.parametrize("endpoint", [
    "tcp://127.0.0.1:1;0.0.0.0:5555",  # ZMQ's source;address syntax: this binds 0.0.0.0:5555
    "tcp://127.0.0.1:0;0.0.0.0:0",
    "tcp://[::1]:1;[::]:5555",
    "tcp://localhost:1;10.0.0.2:5555",
])
def test_an_endpoint_zmq_could_bind_off_loopback_is_public(endpoint):
    assert not is_loopback_endpoint(endpoint)


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0@127.0.0.1:5555", "tcp://127.0.0.1:5555\n",
                                      "tcp://127.0.0.1:5555/x", "tcp://127.0.0.1", "tcp://127.0.0.1:5:6"])
def test_an_endpoint_not_plainly_host_and_port_is_not_guessed_loopback(endpoint):
    assert not is_loopback_endpoint(endpoint)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:0", "tcp://127.0.0.1:*",
                                      "tcp://localhost:1", "tcp://[::1]:1", "tcp://127.0.0.2:9",
                                      "ipc:///tmp/x", "inproc://x"])
def test_loopback_endpoints_stay_loopback(endpoint):
    assert is_loopback_endpoint(endpoint)


@pytest.mark.parametrize("name", ["rl\n", "bot\n", "a\nb", "a b", ".hidden", "x" * 65, ""])
def test_a_name_with_a_newline_or_outside_the_alphabet_is_refused(name):
    from candidate_scheduler.core.access import check_name

    with pytest.raises(ValueError, match="name must be"):
        check_name("tenant", name)


def test_a_tenant_written_by_keys_loads_as_written(tmp_path):
    init_dir(tmp_path)
    with pytest.raises(ValueError):  # before: written as 'rl\n' and read back as 'rl' (another tenant)
        add_key(tmp_path, "bot", "client", "rl\n")
    assert not (tmp_path / "bot.key_secret").exists()


def test_a_token_record_whose_digest_has_a_trailing_newline_is_malformed(tmp_path):
    import json

    init_dir(tmp_path)
    add_token(tmp_path, "arm", "client", "default")
    record = tmp_path / "authorized_tokens" / "arm.json"
    rec = json.loads(record.read_text())
    record.write_text(json.dumps({**rec, "sha256": rec["sha256"] + "\n"}))  # a token that could never match
    with pytest.raises(KeyDirError, match="sha256"):
        Directory.load(tmp_path)


def test_keys_never_overwrites_the_server_key_a_client_was_handed(tmp_path):
    scheduler, host = tmp_path / "scheduler", tmp_path / "trainer"
    init_dir(scheduler)
    add_key(scheduler, "trainer", "client", "rl")
    host.mkdir()
    for name in ("server.key", "trainer.key_secret"):  # what the trainer's host is given
        (host / name).write_bytes((scheduler / name).read_bytes())
    with pytest.raises(KeyDirError, match="server.key"):
        init_dir(host)  # `keys ~/keys --client x` run on the trainer's host by mistake
    assert (host / "server.key").read_bytes() == (scheduler / "server.key").read_bytes()
    assert sorted(p.name for p in host.iterdir()) == ["server.key", "trainer.key_secret"]


def test_one_public_key_under_two_names_is_refused_at_load(tmp_path):
    """A record copied to authorise the same holder again (as an admin, say) made the key whichever
    name sorted last, its role with it: the directory is refused instead, naming both."""
    add_key(tmp_path, "robot1", "client")
    record = (tmp_path / "authorized_clients" / "robot1.key").read_text()
    (tmp_path / "authorized_clients" / "zz-admin.key").write_text(record.replace('role = "client"', 'role = "admin"'))
    assert 'role = "admin"' in (tmp_path / "authorized_clients" / "zz-admin.key").read_text()
    with pytest.raises(KeyDirError, match="'robot1' and 'zz-admin'"):
        Directory.load(tmp_path)


def test_the_worker_pair_is_named_worker_and_an_older_directorys_client_pair_still_serves(tmp_path, monkeypatch):
    """A pair named `client` was easily handed to a robot, and a worker key receives every tenant's
    observations: `keys` names it `worker` now. A directory written before keeps its `client` pair, which
    workers still read, and `keys` adds no second worker pair to it."""
    import zmq
    import zmq.auth

    from candidate_scheduler.core.access import Role
    from candidate_scheduler.service.keys import ClientKeys, worker_key_name
    from candidate_scheduler.worker import link

    new = tmp_path / "new"
    init_dir(new)
    assert (new / "worker.key_secret").exists() and not (new / "client.key_secret").exists()
    assert Directory.load(new).get("worker").role is Role.WORKER and worker_key_name(new) == "worker"

    old = tmp_path / "old"
    init_dir(old)
    for path in (old / "worker.key_secret", old / "worker.key", old / "authorized_clients" / "worker.key"):
        path.rename(path.with_name(path.name.replace("worker", "client")))  # as `keys` wrote it before
    assert init_dir(old) == [] and not (old / "worker.key_secret").exists()
    assert worker_key_name(old) == "client"
    applied = []  # a socket's CURVE keys cannot be read back: what the link applies is recorded
    real_apply = ClientKeys.apply
    monkeypatch.setattr(ClientKeys, "apply", lambda keys, sock: (applied.append(keys.public), real_apply(keys, sock)))
    ctx = zmq.Context()
    link.connect(ctx, "tcp://127.0.0.1:9", "w1", str(old)).close(0)
    ctx.term()
    public, _ = zmq.auth.load_certificate(str(old / "authorized_clients" / "client.key"))
    assert applied == [public]
