#!/usr/bin/env bash
# The README's main job: install what is missing, build, run the main workload.
# For now the workload is the format accuracy benchmark (CPU reference kernels): attention
# output error of fp8 K and TurboNV V against bf16 K/V on synthetic data.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
./build/bench/kvpool-bench accuracy
