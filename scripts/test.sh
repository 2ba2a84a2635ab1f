#!/usr/bin/env bash
# The README's test command: builds, then runs every test this machine can run. Tests labelled
# `gpu` (and `multigpu`) run only where nvidia-smi sees a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
build_dir=${KVP_BUILD_DIR:-build}
label_filter=(-LE gpu)
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  label_filter=()
fi
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)" "${label_filter[@]}"
