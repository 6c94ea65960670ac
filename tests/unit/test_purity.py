"""The pure rooms stay pure: importing every module of candidate_scheduler/core loads no socket, event
loop, tensor or wire library, so the engine and its rules run (and are tested) in any process."""

import pkgutil
import subprocess
import sys

import candidate_scheduler.core
from tests.unit.fresh_imports import heavy_modules_loaded

FORBIDDEN = ("zmq", "asyncio", "torch", "sglang", "msgspec")


def test_core_modules_import_none_of_the_io_libraries():
    modules = sorted(f"candidate_scheduler.core.{m.name}" for m in pkgutil.iter_modules(candidate_scheduler.core.__path__))
    assert "candidate_scheduler.core.engine" in modules and len(modules) >= 10
    assert heavy_modules_loaded(modules, FORBIDDEN) == []


def test_the_package_root_is_light_and_still_offers_the_client():
    code = (
        "import sys, candidate_scheduler\n"
        "assert 'zmq' not in sys.modules\n"
        "from candidate_scheduler import Client, AsyncClient\n"
        "assert 'zmq' in sys.modules and Client.__name__ == 'Client'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_sources_hold_no_lazy_imports_of_the_io_libraries():
    # an import inside a function passes the test above and still puts torch in the scheduler one day
    import re
    from pathlib import Path

    pattern = re.compile(rf"^\s*(import|from)\s+({'|'.join(FORBIDDEN)})\b", re.M)
    offenders = [f"{p.name}: {m.group(0).strip()}" for p in Path(candidate_scheduler.core.__path__[0]).glob("*.py")
                 for m in pattern.finditer(p.read_text())]
    assert offenders == []
