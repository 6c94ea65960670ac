"""What carries a client's secret key never shows it in a repr (logs, tracebacks, test reports), and a
test harness reads `--curve-dir=DIR` as argparse does."""

from __future__ import annotations

import zmq

from candidate_scheduler.service import launcher
from candidate_scheduler.service.keys import ClientKeys
from candidate_scheduler.service.ray_placement import ClientSpec, RayService


def test_the_ray_specs_never_show_the_secret_key():
    server_public, _ = zmq.curve_keypair()
    keys = ClientKeys.ephemeral(server_public)
    secret = keys.secret.decode()
    spec = ClientSpec("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", keys.to_env())
    service = RayService("cs", {"request endpoint": "tcp://127.0.0.1:1", "control endpoint": "tcp://127.0.0.1:2"},
                         scheduler=None, keys=keys.to_env())
    assert secret in spec.keys  # it is carried...
    assert secret not in repr(spec) and secret not in repr(service)  # ...and never shown
    assert service.client_spec() == spec


def test_the_last_curve_dir_wins_in_either_spelling():
    assert launcher._last_value(["--curve-dir", "/a", "--x", "1"], "--curve-dir") == "/a"
    assert launcher._last_value(["--curve-dir=/a"], "--curve-dir") == "/a"
    assert launcher._last_value(["--curve-dir", "/a", "--curve-dir=/b"], "--curve-dir") == "/b"
    assert launcher._last_value(["--curve-dir-other=/a", "--x"], "--curve-dir") is None
