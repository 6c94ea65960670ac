"""What both benchmarks share: paths, the prompt, summary statistics and what a run records about itself
(git revision, package versions, load average), number formatting and JSON encoding."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / ".cache" / "tiny-cosmos3"
DEFAULT_OUT = ROOT / "bench" / "results"
PROMPT = "pick up the red cube"


def summary_stats(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"median": None, "p90": None, "p99": None, "min": None, "max": None, "n": 0}
    return {
        "median": float(np.median(arr)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "n": int(arr.size),
    }


def forecast_errors(metrics_list) -> dict | None:
    """The cost model's error over these replies' assignments (each reply's `forecasts`), per forward
    label: measured / predicted at p10, p50 and p90, the share within 10% of the prediction, and how
    many. None when no reply carries a calibrated prediction."""
    by_label: dict[str, list[float]] = {}
    for metrics in metrics_list:
        for f in (metrics or {}).get("forecasts") or ():
            if f.get("predicted_s", 0) > 0:
                by_label.setdefault(f["label"], []).append(f["measured_s"] / f["predicted_s"])
    if not by_label:
        return None
    out = {}
    for label, ratios in sorted(by_label.items()):
        arr = np.asarray(ratios)
        out[label] = {"n": int(arr.size), "p10": float(np.percentile(arr, 10)), "p50": float(np.median(arr)),
                      "p90": float(np.percentile(arr, 90)), "within_10pct": float(np.mean(np.abs(arr - 1) <= 0.1))}
    return out


def median_range(values, form: str = "{:.2f}") -> str:
    """A report cell for repeated runs: the median, then [min-max]; "-" with no value (None skipped)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return f"{form.format(float(np.median(vals)))} [{form.format(min(vals))}-{form.format(max(vals))}]"


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return float(num) / float(den)


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return f"{rev}{'+dirty' if dirty else ''}" or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def package_version(pkg: str) -> str:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return "unknown"


def ensure_model(model: str) -> None:
    path = Path(model)
    if path == DEFAULT_MODEL.resolve() or (not path.exists() and path.name == "tiny-cosmos3"):
        from candidate_scheduler.worker.tiny_checkpoint import ensure_checkpoint

        ensure_checkpoint(path)
    elif not (path / "model_index.json").exists():
        raise SystemExit(f"--model {model}: no model_index.json there (a Cosmos3 checkpoint directory is needed)")


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

