"""The benchmark's entry point under its old name: `candidate_scheduler.cli` calls `harness.main` and
`harness.build_parser`. The code lives in the modules of this package (see its docstring)."""

from candidate_scheduler.bench.cli import build_parser, main

__all__ = ["build_parser", "main"]
