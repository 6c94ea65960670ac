"""A self-signed certificate for localhost, 127.0.0.1 and ::1 (valid until 2126) and its key, for the
TLS tests; test-only keys, public on purpose. `OTHER_KEY` belongs to no certificate. Made with:

    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem -out cert.pem \\
        -days 36500 -subj "/CN=candidate-scheduler test" \\
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out other_key.pem
"""

from __future__ import annotations

import ssl
from pathlib import Path

HERE = Path(__file__).resolve().parent / "tls"
CERT, KEY, OTHER_KEY = str(HERE / "cert.pem"), str(HERE / "key.pem"), str(HERE / "other_key.pem")


def client_context() -> ssl.SSLContext:
    """A client that trusts the test certificate only (and checks the host name)."""
    return ssl.create_default_context(cafile=CERT)
