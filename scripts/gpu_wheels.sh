#!/usr/bin/env bash
# The wheels `make gpu-check` installs on a lent CUDA machine with no package registry (Python 3.12,
# x86-64, its own torch): the distributions named in scripts/gpu_wheels.txt at the lock's versions, and
# sglang. Written to .whl/ (git-ignored); sglang's Rust server extensions are dropped from its wheel
# (17 MB; the diffusion runtime does not import them) so the call's 64 MiB limit holds.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
KEEP="^($(grep -v '^#' scripts/gpu_wheels.txt | paste -sd'|'))=="
grep -E "$KEEP" requirements/lock.txt > .whl/requirements.txt
PLATFORMS=()
for p in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl -r .whl/requirements.txt "sglang==0.5.23"
rm .whl/requirements.txt
python3 - <<'PY'
import glob, os, zipfile
src = glob.glob(".whl/sglang-0.5.23-*.whl")[0]
tmp = src + ".slim"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if item.filename.startswith(("sglang/srt/rust_extensions/", "sglang/multimodal_gen/test/")):
            continue
        zout.writestr(item, zin.read(item.filename))
os.replace(tmp, src)
PY
du -sh .whl
