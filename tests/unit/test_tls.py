"""TLS for the token-taking fronts (service/tls.py): a certificate and key are read once, at start, and a
wrong one is one line naming the files; the context they make serves a real handshake that a client
trusting the certificate completes and one that does not refuses; the command lines refuse half a pair."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading

import pytest

from candidate_scheduler.service.tls import TlsError, cleartext_token_warning, pair_refusal, server_context
from tests.tls_files import CERT, KEY, OTHER_KEY, client_context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bytes:
    """One TLS connection over loopback: the client sends a line, the server echoes it back."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve():
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(tls.recv(100))
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                    client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"hello\n")
                return tls.recv(100)
        finally:
            thread.join(5)


def test_a_certificate_and_its_key_serve_a_handshake_a_trusting_client_completes():
    context = server_context(CERT, KEY)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert _handshake(context, client_context()) == b"hello\n"


def test_a_client_that_does_not_trust_the_certificate_refuses_it():
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server_context(CERT, KEY), ssl.create_default_context())


@pytest.mark.parametrize("cert, key, says", [
    (CERT, OTHER_KEY, "key values mismatch"),
    (CERT, "/nonexistent/key.pem", "No such file"),
    (KEY, KEY, "PEM"),  # a key where the certificate should be
])
def test_a_pair_that_cannot_serve_is_one_line_naming_both_files(cert, key, says):
    with pytest.raises(TlsError) as refused:
        server_context(cert, key)
    message = str(refused.value)
    assert "\n" not in message and cert in message and key in message and says in message, message


def test_half_a_pair_is_refused_and_the_warning_names_the_fix():
    assert pair_refusal(None, None) is None and pair_refusal("c", "k") is None
    assert pair_refusal("c", None) == "--tls-cert needs --tls-key too: the certificate and its private key"
    assert pair_refusal(None, "k", "--openpi-tls-cert", "--openpi-tls-key").startswith("--openpi-tls-key needs "
                                                                                          "--openpi-tls-cert")
    note = cleartext_token_warning("the HTTP server", "10.0.0.5")
    assert "10.0.0.5" in note and "--tls-cert FILE --tls-key FILE" in note and "\n" not in note


@pytest.mark.parametrize("argv, says", [
    (["http", "--tls-cert", CERT], "--tls-cert needs --tls-key"),
    (["http", "--tls-cert", CERT, "--tls-key", OTHER_KEY], "cannot serve TLS"),
    (["serve", "--openpi-port", "0", "--openpi-tls-key", KEY], "--openpi-tls-key needs --openpi-tls-cert"),
    (["serve", "--openpi-port", "0", "--openpi-tls-cert", CERT, "--openpi-tls-key", OTHER_KEY], "cannot serve TLS"),
])
def test_the_command_lines_refuse_a_bad_pair_in_one_line_before_they_listen(argv, says):
    proc = subprocess.run([sys.executable, "-m", "candidate_scheduler.cli", *argv, "--metrics-port", "-1"]
                          if argv[0] == "serve" else [sys.executable, "-m", "candidate_scheduler.cli", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
