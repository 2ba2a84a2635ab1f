#!/usr/bin/env bash
# Runs on a GPU host, from the repository root, with gpu-bundle/ beside it (scripts/gpu-bundle.sh):
# the GPU tests, then `kvpool-bench kernels` and the PyTorch baselines, merged into one results
# file and a table.   scripts/gpu-check.sh OUT_DIR [--quick]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
out=$1
shift
mkdir -p "$out"
status=0
gpu-bundle/run cuda_kernels_test 2>&1 | tee "$out/gpu-tests.log" | grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]|Failure|Expected|Which is|actual|error" | head -80
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
gpu-bundle/run cuda_arena_test "$PWD/gpu-bundle/bin/kvpool_arena_child" 2>&1 | tee "$out/arena-tests.log" | grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED \]|Failure" | head -20
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
gpu-bundle/run kvpool-bench attach --gib=64 --json="$out/attach-h200.json" 2>&1 | tee "$out/attach.log" || status=1
gpu-bundle/run kvpool-bench kernels --json="$out/kernels.json" "$@" 2>&1 | tee "$out/kernels.log" || status=1
python3 bench/torch_baselines.py --json="$out/torch.json" "$@" 2>&1 | tee "$out/torch.log" || status=1
python3 bench/report.py "$out/kernels.json" "$out/torch.json" "$out/kernels-h200.json" | tee "$out/table.md" || status=1
exit $status
