#!/usr/bin/env bash
# Builds (Release, sm_90a) and packs the GPU test and benchmark binaries, and the service binaries
# they start, with their libraries into gpu-bundle/, for a GPU host that lacks Abseil and friends
# (scripts/bundle-binaries.sh). On the GPU host: gpu-bundle/run BINARY [ARGS...].
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
rm -rf gpu-bundle
./scripts/bundle-binaries.sh gpu-bundle build/tests/kernels/cuda_kernels_test build/tests/kvpool/cuda_arena_test \
  build/tests/kvpool/kvpool_arena_child build/bench/kvpool-bench \
  build/daemon/kvpoold build/worker/kvpool-worker build/client/kvpoolctl \
  build/tests/integration/service_gpu_test build/tests/integration/restart_test
