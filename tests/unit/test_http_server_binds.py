"""sglang's HTTP server run from Python (`compat.http.run_http_server`), as the CLI runs it: off
loopback without tokens it refuses before anything is imported or listens, unless told `insecure`."""

from __future__ import annotations

import pytest

from candidate_scheduler.compat import http


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.org"])
def test_a_public_host_without_tokens_is_refused(host, monkeypatch):
    called = []
    monkeypatch.setattr(http, "make_http_server_args", lambda *a, **k: called.append(a))
    with pytest.raises(ValueError, match="without tokens"):
        http.run_http_server(30001, "/nonexistent", host, 30000)
    assert not called  # refused before sglang's server arguments were even built


def test_loopback_tokens_or_insecure_go_on_to_start(monkeypatch):
    started = []

    class Stop(Exception):
        pass

    def args(*a, **k):
        started.append(a[2])
        raise Stop

    monkeypatch.setattr(http, "make_http_server_args", args)
    for host, kw in (("127.0.0.1", {}), ("0.0.0.0", {"insecure": True}), ("0.0.0.0", {"tokens": object()})):
        with pytest.raises(Stop):
            http.run_http_server(30001, "/nonexistent", host, 30000, **kw)
    assert started == ["127.0.0.1", "0.0.0.0", "0.0.0.0"]
