"""The robot side of the openpi tests: a venv of its own with the real `openpi-client`.

openpi-client 0.1.2 pins numpy<2; the service's lock has numpy 2.4. A robot runs openpi's client in
its own environment, so the tests do too: `.cache/openpi-client-venv`, built once per machine from
requirements/openpi-client.txt (PyPI) and rebuilt when that file changes. Run by `make test` first
(``python tests/compat/openpi_client_env.py``) and by the test module's fixture when missing.
A cross-process lock keeps two test runs from building it at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements" / "openpi-client.txt"
VENV = ROOT / ".cache" / "openpi-client-venv"


def _stamp() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return VENV / f".built-{digest}"


def client_python() -> Path:
    """The venv's python, building the venv first if it is missing or stale."""
    python = VENV / "bin" / "python"
    if _stamp().exists():
        return python
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".openpi-client-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _stamp().exists():
            _build(python)
    return python


def _build(python: Path) -> None:
    print(f">> building {VENV} (openpi-client and numpy<2, from PyPI; once per machine)", file=sys.stderr, flush=True)
    for old in VENV.glob(".built-*"):
        old.unlink()
    # the base interpreter, not the project's venv: the client venv must not see the project's packages
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base if base.exists() else sys.executable), "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
                   check=True)
    subprocess.run([str(python), "-c", "import openpi_client.websocket_client_policy, numpy; "
                    "assert numpy.__version__.startswith('1.'), numpy.__version__"], check=True)
    _stamp().touch()


if __name__ == "__main__":
    print(client_python())
