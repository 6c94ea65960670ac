"""How many candidate rows one transformer call may carry (`worker --call-rows`).

A cohort's candidates share one transformer call by default. On the CPU that is bitwise each
candidate's call alone (the parity tests); on CUDA it is not: an H200 gave batched candidates up to
0.56 away from sglang's pipeline alone over 10 steps with CFG while N=1 was bitwise
(bench/results/gpu_check_20261204b), and which op depends on the rows beside a candidate is not known
yet. So "auto" is one candidate a call on CUDA: sglang's own call shape. Pure: the CLI checks a value
with it before any model code is imported.
"""

from __future__ import annotations

CHOICES = "auto, all or a number of rows (1 or more)"


def parse(value: int | str | None) -> int | str | None:
    """"auto", None (all of a cohort's rows in one call) or a positive number of rows; ValueError else."""
    if value is None or value == "all":
        return None
    if value == "auto":
        return "auto"
    try:
        rows = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float
        raise ValueError(f"call rows must be {CHOICES}, not {value!r}") from None
    if rows < 1 or isinstance(value, bool) or (isinstance(value, float) and value != rows):
        raise ValueError(f"call rows must be {CHOICES}, not {value!r}")
    return rows


def resolve(value: int | str | None, device: str) -> int | None:
    """The rows a call may carry on `device` (None: all of a cohort's): "auto" is all on the CPU and 1
    anywhere else."""
    rows = parse(value)
    if rows == "auto":
        return None if device == "cpu" else 1
    return rows
