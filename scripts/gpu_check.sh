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
# Stand-ins (scripts/gpu_shims), each only where its module is missing, so none shadows a real one:
# sgl_kernel, which sglang imports at module level on CUDA (its rmsnorm family in torch; any other
# function raises when called; the report says so), with sphinx (the lent image holds an empty folder);
# imageio_ffmpeg, imported beside sglang's output helpers (its wheel is too large to carry).
SHIMS=$(mktemp -d /tmp/cs-gpu-shims.XXXXXX)
trap 'rm -rf "$SHIMS"' EXIT
"$PY" -c "import sgl_kernel" 2>/dev/null || ln -s "$PWD/scripts/gpu_shims/sgl_kernel" "$PWD/scripts/gpu_shims/sphinx" "$SHIMS/"
"$PY" -c "import imageio_ffmpeg" 2>/dev/null || ln -s "$PWD/scripts/gpu_shims/imageio_ffmpeg" "$SHIMS/"
export PYTHONPATH="$SHIMS${PYTHONPATH:+:$PYTHONPATH}"
[ -f .cache/tiny-cosmos3/tiny_checkpoint.json ] || "$PY" -m candidate_scheduler.cli make-checkpoint .cache/tiny-cosmos3
ARGS=(--out "$OUT_DIR")
if [ "${DRY_RUN:-0}" = 1 ]; then
  ARGS+=(--dry-run --out "${GPU_CHECK_OUT:-$(mktemp -d)}" --budget-s "${GPU_CHECK_BUDGET_S:-300}")
else
  ARGS+=(--budget-s "${GPU_CHECK_BUDGET_S:-540}")
fi
"$PY" -m candidate_scheduler.bench.gpu_check "${ARGS[@]}" "$@"
