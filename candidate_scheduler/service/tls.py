"""TLS for the two fronts that take bearer tokens: the openpi websocket and sglang's HTTP server.

A bearer token is a password sent with every connection: across a network that is not yours it needs
TLS, or anyone on the path can read it and submit work as its holder. The native sockets and the worker
link need none of this (CURVE encrypts and authenticates them). Either front may also sit behind a
TLS-terminating proxy; one that listens off loopback with tokens and without TLS says so at start
(`cleartext_token_warning`).

`server_context` reads a certificate chain and its key once, at start, so a wrong path, a key that
does not match, or a file that is not PEM is one line (`TlsError`) before anything listens, not a
traceback from the server library later."""

from __future__ import annotations

import ssl

TLS_FLAGS = "--tls-cert FILE --tls-key FILE"


class TlsError(ValueError):
    """The certificate or key cannot serve TLS; the message is one line naming the files."""


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """A server-side context for `cert` (PEM, the chain: this server's certificate first) and `key`
    (PEM, unencrypted). TLS 1.2 at least, Python's default ciphers."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except OSError as exc:  # ssl.SSLError among them: a key that does not match, a file that is not PEM
        reason = exc.strerror or exc
        raise TlsError(f"cannot serve TLS with certificate {cert} and key {key}: {reason}") from None
    return context


def pair_refusal(cert: str | None, key: str | None, cert_flag: str = "--tls-cert", key_flag: str = "--tls-key") -> str | None:
    """Why the two flags cannot be used as given (one without the other), or None."""
    if (cert is None) == (key is None):
        return None
    given, missing = (cert_flag, key_flag) if cert is not None else (key_flag, cert_flag)
    return f"{given} needs {missing} too: the certificate and its private key"


def cleartext_token_warning(front: str, host: str, flags: str = TLS_FLAGS) -> str:
    """The note a front prints when it takes bearer tokens off loopback without TLS."""
    return (f"note: {front} takes bearer tokens on {host} without TLS: a token crosses the network in the clear. "
            f"Pass {flags}, or put a TLS-terminating proxy in front of it")
