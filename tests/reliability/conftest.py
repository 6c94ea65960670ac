"""The reliability suite: `--reliability-long` and the end-of-session summary table.

`pytest tests` (and `make test`) runs the short version; `make reliability` runs
`pytest tests/reliability --reliability-long` (or set RELIABILITY_LONG=1). The randomness is seeded:
RELIABILITY_SEED=N reproduces a run (the seed is printed in the summary).

Each test records what it tried and what held through the `reliability` fixture; at the end of the
session `pytest_terminal_summary` prints one table and writes it as JSON and markdown under the
session's pytest tmp dir (and, for the long run, to bench/results/reliability.{md,json}).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from tests.reliability.helpers import LONG, SHORT, Scale

ROOT = Path(__file__).resolve().parents[2]
_STATE_KEY = pytest.StashKey["Report"]()


def pytest_addoption(parser):
    group = parser.getgroup("reliability")
    group.addoption("--reliability-long", action="store_true", default=False,
                    help="run the long reliability suite (make reliability) instead of the short one")


def _is_long(config) -> bool:
    try:
        flag = bool(config.getoption("reliability_long"))
    except ValueError:  # this conftest was not an initial one (pytest tests): the option is unknown
        flag = False
    return flag or os.environ.get("RELIABILITY_LONG", "") not in ("", "0")


@dataclass
class Row:
    area: str
    check: str
    tried: int
    held: str
    ok: bool = True
    test: str = ""


@dataclass
class Report:
    long: bool
    seed: int
    scale: Scale
    rows: list[Row] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=lambda: {
        "requests": 0, "replies": 0, "lost": 0, "duplicated": 0, "partial_aggregates": 0, "wrong_results": 0,
    })
    started: float = field(default_factory=time.time)
    current_test: str = ""

    def add(self, area: str, check: str, tried: int, held: str, ok: bool = True) -> None:
        self.rows.append(Row(area, check, int(tried), held, bool(ok), self.current_test))

    def tally(self, **counts: int) -> None:
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + int(v)


def _report(config) -> Report:
    report = config.stash.get(_STATE_KEY, None)
    if report is None:
        long = _is_long(config)
        seed = int(os.environ.get("RELIABILITY_SEED", "20240611"))
        report = Report(long=long, seed=seed, scale=LONG if long else SHORT)
        config.stash[_STATE_KEY] = report
    return report


@pytest.fixture
def reliability(request) -> Report:
    """The session's report: `.scale` (short or long sizes), `.seed`, `.add(...)`, `.tally(...)`."""
    report = _report(request.config)
    report.current_test = request.node.name
    return report


@pytest.fixture
def rng_seed(reliability, request) -> int:
    """A per-test seed derived from the session seed and the test name (stable across runs)."""
    import zlib

    return (reliability.seed * 1_000_003 + zlib.crc32(request.node.name.encode())) & 0x7FFFFFFF


def _markdown(report: Report, outcomes: dict[str, str], elapsed: float) -> str:
    mode = "long (`make reliability`)" if report.long else "short (in `make test`)"
    lines = [
        f"Reliability run: {mode}, seed {report.seed}, {elapsed:.0f} s, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        "| area | check | tried | what held | ok |",
        "|---|---|---:|---|:-:|",
    ]
    for r in report.rows:
        ok = r.ok and outcomes.get(r.test, "passed") == "passed"
        lines.append(f"| {r.area} | {r.check} | {r.tried} | {r.held} | {'yes' if ok else '**NO**'} |")
    t = report.totals
    lines += [
        "",
        f"Totals over every group sent: requests = {t['requests']}, replies = {t['replies']}, "
        f"lost = {t['lost']}, duplicated = {t['duplicated']}, partial aggregates = {t['partial_aggregates']}, "
        f"wrong results = {t['wrong_results']}"
        + (f" (not counted: {t['sigkilled_in_flight']} groups the stopped scheduler never answered -- in flight at "
           "SIGKILL, or sent as it stopped; the restarted scheduler reports them `unknown` and their retries are counted)"
           if t.get("sigkilled_in_flight") else "") + ".",
    ]
    failed = sorted(name for name, o in outcomes.items() if o != "passed")
    lines.append("Tests: " + ", ".join(f"{n} {o}" for n, o in sorted(outcomes.items())) if failed
                 else f"Tests: all {len(outcomes)} passed.")
    return "\n".join(lines) + "\n"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = config.stash.get(_STATE_KEY, None)
    if report is None:
        return
    outcomes: dict[str, str] = {}
    for key in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(key, []):
            nodeid = getattr(rep, "nodeid", "")
            if "tests/reliability/" not in nodeid.replace(os.sep, "/"):
                continue
            name = nodeid.split("::")[-1]
            if key == "passed" and getattr(rep, "when", "call") != "call":
                continue
            if outcomes.get(name) in ("failed", "error"):
                continue
            outcomes[name] = key
    elapsed = time.time() - report.started
    md = _markdown(report, outcomes, elapsed)
    terminalreporter.write_sep("=", "reliability summary")
    terminalreporter.write_line(md)
    payload = {
        "long": report.long, "seed": report.seed, "elapsed_s": round(elapsed, 1), "scale": asdict(report.scale),
        "rows": [asdict(r) for r in report.rows], "totals": report.totals, "tests": outcomes,
    }
    targets = []
    try:
        base = config._tmp_path_factory.getbasetemp()  # noqa: SLF001 - the session's pytest tmp dir
        targets.append(Path(base) / "reliability")
    except Exception:  # noqa: BLE001
        pass
    if report.long:
        targets.append(ROOT / "bench" / "results")
    for d in targets:
        try:
            d.mkdir(parents=True, exist_ok=True)
            (d / "reliability.md").write_text("# Reliability summary\n\n" + md)
            (d / "reliability.json").write_text(json.dumps(payload, indent=2) + "\n")
            terminalreporter.write_line(f"reliability summary written to {d / 'reliability.md'} (+ .json)")
        except OSError as exc:
            terminalreporter.write_line(f"could not write the reliability summary to {d}: {exc}")
