"""The garbage collector as the scheduler's process sets it (`commands._serve`), in a module of its
own so the in-process benchmarks can set theirs alike without importing the command line."""

from __future__ import annotations

import gc

GC_GEN0_THRESHOLD = 50_000  # allocations between young collections (Python's default: 700)


def tune_gc() -> None:
    """For the scheduler's process, which owns its interpreter: its loop allocates a few dozen
    short-lived objects per group, and at the default gen-0 threshold a collection runs every few
    groups -- about a tenth of the engine's time per group, measured in process (median of six
    interleaved runs, 302 against 261 us). What exists at start (imports, sockets, keys) is frozen out
    of collections for good."""
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
