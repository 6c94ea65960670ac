"""What a fresh interpreter loads: the check that a module stays light, run apart from pytest's own
process (which has imported everything already)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def heavy_modules_loaded(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    """Which of `heavy` are in sys.modules after a fresh interpreter imports `modules`."""
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])
