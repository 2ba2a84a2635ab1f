#!/usr/bin/env bash
# Runs on a GPU host, from the repository root, with gpu-bundle/ beside it (scripts/gpu-bundle.sh):
# the service's GPU tests, then the service benchmarks on the cuda backend:
#   - the main workload (as the quick start runs it, on the GPU),
#   - a decode step of a real-model-shaped pool (61 layers, batch 64, 32k context) through the
#     service, against the worker's own kernel time, returning the last layer's outputs (1.5 MB
#     per step) and returning lengths only (what a full model's decode returns),
#   - the same with kvpoold, each worker and the client pinned to a core of their own (what
#     deploy/ recommends: a ZeroMQ hop then wakes one thread on another core instead of three),
#   - a long prefill on one pool decoded on another (scripts/gpu-stream.sh),
# each written as JSON into OUT_DIR.   scripts/gpu-service.sh OUT_DIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0
out=$1
mkdir -p "$out"
here=$PWD/gpu-bundle
export KVPOOLD_BIN=$here/bin/kvpoold KVPOOL_WORKER_BIN=$here/bin/kvpool-worker
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
status=0

logs=$(mktemp -d /tmp/kvpool-logs-XXXXXX)  # one file of logs comes back: $out/logs.txt
trap 'tail -n 40 "$logs"/* > "$out/logs.txt" 2>&1' EXIT

for test in cuda_kernels_test service_gpu_test; do
  gpu-bundle/run $test 2>&1 | tee "$logs/$test.log" | grep -E "^\[  (PASSED|FAILED)|FAILED \]|Failure|Expected|Which is|actual" | head -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

# One service at a time: kvpoold + a prefill and a decode worker on GPU 0; $@ are kvpoold flags.
# $pin_daemon, $pin_prefill, $pin_decode: a command prefix each (taskset), empty for none.
pin_daemon="" pin_prefill="" pin_decode=""
run_service() {
  local dir
  dir=$(mktemp -d /tmp/kvpool-bench-XXXXXX)
  $pin_daemon gpu-bundle/run kvpoold --runtime_dir="$dir" --backend=cuda --gpu=0 --metrics_port=-1 \
    "$@" >"$logs/kvpoold-$name.log" 2>&1 &
  daemon=$!
  $pin_prefill gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=prefill \
    >"$logs/prefill-$name.log" 2>&1 &
  prefill=$!
  $pin_decode gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=decode \
    >"$logs/decode-$name.log" 2>&1 &
  decode=$!
  endpoint="ipc://$dir/kvpoold.sock"
}
stop_service() {
  kill -TERM "$daemon" "$prefill" "$decode" 2>/dev/null
  wait "$daemon" "$prefill" "$decode" 2>/dev/null
}

name=workload
run_service --arena_mib=8192 --layers=4 --topk=256
gpu-bundle/run kvpoolctl bench --endpoint="$endpoint" --device="$device" \
  --out="$out/service-workload-h200.json" 2>/dev/null || status=1
stop_service

# $1: a command prefix for the client, $2: what the placement is called, $3: file name suffix.
bench_decode() {
  for outputs in last none; do
    $1 gpu-bundle/run kvpoolctl bench-decode --endpoint="$endpoint" --device="$device" \
      --batch=64 --context=32768 --steps=50 --outputs=$outputs --placement="$2" \
      --out="$out/service-decode-$outputs$3-h200.json" 2>/dev/null || status=1
  done
}

name=decode
run_service --arena_mib=12288 --layers=61 --topk=2048
bench_decode "" "default" ""
stop_service

name=decode-pinned
pin_daemon="taskset -c 2" pin_prefill="taskset -c 4" pin_decode="taskset -c 6"
run_service --arena_mib=12288 --layers=61 --topk=2048
bench_decode "taskset -c 8" "one core each: kvpoold 2, prefill 4, decode 6, client 8" "-pinned"
stop_service

scripts/gpu-stream.sh "$out" || status=1

exit $status
