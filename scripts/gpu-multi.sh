#!/usr/bin/env bash
# The two-GPU run (docs/benchmarks.md, "Migrations"), on a GPU host from the repository root with
# gpu-bundle/ beside it (scripts/gpu-bundle.sh): the multigpu tests (moves by peer copy and by
# NCCL between GPU 0 and GPU 1, bytes and decode outputs identical, receiver and sender killed),
# then `kvpool-bench migrate` from GPU 0 to GPU 1 (cudaMemcpyPeer and raw ncclSend/ncclRecv in the
# same run as the paths), once as NCCL chooses and once forced onto its network transport
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: what a move between nodes takes), and
# scripts/gpu-stream.sh with a pool on each GPU.
#   scripts/gpu-multi.sh OUT_DIR
# With one GPU it is a dry run: the multigpu tests skip themselves, the migrate bench runs on GPU 0
# alone, and it stops with exit status 3 saying what needs the second GPU.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export KVPOOLD_BIN=$PWD/gpu-bundle/bin/kvpoold KVPOOL_WORKER_BIN=$PWD/gpu-bundle/bin/kvpool-worker
out=$1
mkdir -p "$out"
status=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
gpu-bundle/run service_gpu_test --gtest_filter='*ServiceMultiGpuTest.*' 2>&1 |
  tee "$out/multigpu-tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED)|OK \]|FAILED \]|SKIPPED \]|Failure|Expected|Which is" | head -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "$gpus" -lt 2 ]; then
  gpu-bundle/run kvpool-bench migrate --source_gpu=0 --target_gpu=0 2>&1 | tee "$out/migrate-one-gpu.log" || status=1
  echo "gpu-multi: this host has $gpus GPU; the NCCL and peer-copy moves between GPUs, the kill" \
       "tests on two GPUs and kvpool-bench migrate --target_gpu=1 need two (nvidia-h200-x2)." \
       "Nothing of the two-GPU run was measured." >&2
  exit 3
fi
gpu-bundle/run kvpool-bench migrate --source_gpu=0 --target_gpu=1 --json="$out/migrate-h200x2.json" 2>&1 |
  tee "$out/migrate.log" || status=1
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 gpu-bundle/run kvpool-bench migrate --source_gpu=0 --target_gpu=1 \
  --json="$out/migrate-h200x2-net.json" 2>&1 | tee "$out/migrate-net.log" || status=1
# A long prefill on GPU 0 decoded on GPU 1 through the service, moved after or streamed.
scripts/gpu-stream.sh "$out" 0,1 || status=1
exit $status
