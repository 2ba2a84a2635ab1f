#!/usr/bin/env bash
# Configures (once) and builds kvpool in build/ (Release). CUDA kernels are included when nvcc is
# found. Extra arguments go to CMake's configure step, e.g. -DKVP_ENABLE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${KVP_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build_dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$build_dir" --parallel "$(nproc)"
