#!/usr/bin/env bash
# `make gpu-check` (DRY_RUN=1: the CPU rehearsal): one short, prepared run on a CUDA machine (issue 24).
# The phases and their time caps are candidate_scheduler/bench/gpu_check.py; this file only finds a Python.
#   - a checkout with `make setup` done: its .venv;
#   - a lent machine with no package registry (its own torch): the project's other pins as wheels in
#     .whl/ (scripts/gpu_wheels.sh downloads them), installed to a scratch folder in front of its torch;
#   - otherwise: `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 SGLANG_DISABLE_COSMOS3_GUARDRAILS=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-bench/results}}
if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
elif [ -d .whl ]; then
  echo "gpu-check: installing $(ls .whl | wc -l) carried wheels to /tmp/cs-site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cs-site .whl/*.whl
  export PYTHONPATH="/tmp/cs-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  PY=python3
else
  make setup
  PY=.venv/bin/python
fi
# sglang imports sgl_kernel at module level on CUDA; where it is not installed, the stand-in (its
# rmsnorm family in torch; any other function raises when called) takes its place, and the report says so.
if ! "$PY" -c "import sgl_kernel" 2>/dev/null; then
  export PYTHONPATH="$PWD/scripts/gpu_shims${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -f .cache/tiny-cosmos3/tiny_checkpoint.json ] || "$PY" -m candidate_scheduler.cli make-checkpoint .cache/tiny-cosmos3
ARGS=(--out "$OUT_DIR")
if [ "${DRY_RUN:-0}" = 1 ]; then
  ARGS+=(--dry-run --out "${GPU_CHECK_OUT:-$(mktemp -d)}" --budget-s "${GPU_CHECK_BUDGET_S:-300}")
else
  ARGS+=(--budget-s "${GPU_CHECK_BUDGET_S:-540}")
fi
exec "$PY" -m candidate_scheduler.bench.gpu_check "${ARGS[@]}" "$@"
