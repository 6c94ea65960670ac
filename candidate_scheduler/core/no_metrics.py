"""The engine's default metrics sink: every call is a no-op (tests that do not look at metrics, and
the in-process benchmarks). The scheduler's process passes service/metrics.SchedulerMetrics instead."""

from __future__ import annotations


def _ignore(*_args, **_kwargs) -> None:
    return None


class NoMetrics:
    def __getattr__(self, name: str):
        setattr(self, name, _ignore)  # asked once per name: the engine calls a dozen per group
        return _ignore
