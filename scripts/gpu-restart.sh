#!/usr/bin/env bash
# Runs on a GPU host, from the repository root, with gpu-bundle/ beside it (scripts/gpu-bundle.sh):
# what keeping the cache across a kvpoold restart rests on and costs (docs/design.md §10):
#   - cuda_arena_test: cuMemCreate chunks outlive the process that created them while another
#     process maps them or holds their fds, and can be adopted and handed on;
#   - restart_test on the cuda backend (SIGKILL, SIGTERM, crash points), two pools on GPU 0;
#   - kvpool-bench recovery --cuda: replaying the state of 100,000 sequences and adopting a
#     64 GiB arena;
#   - the service's decode step (61 layers, batch 64, 32k context) with and without --state_dir.
# Results go to OUT_DIR as JSON.   scripts/gpu-restart.sh OUT_DIR [CRASH_POINTS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
out=$1
points=${2:-40}
mkdir -p "$out"
here=$PWD/gpu-bundle
export KVPOOLD_BIN=$here/bin/kvpoold KVPOOL_WORKER_BIN=$here/bin/kvpool-worker
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
status=0
logs=$(mktemp -d /tmp/kvpool-logs-XXXXXX)
trap 'tail -n 30 "$logs"/* > "$out/logs.txt" 2>&1' EXIT
summary() { grep -E "^\[  (PASSED|FAILED)|FAILED \]|Failure|Expected|Which is|actual|SKIPPED" | head -30; }

gpu-bundle/run cuda_arena_test "$here/bin/kvpool_arena_child" 2>&1 | tee "$logs/arena.log" | summary
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
KVPOOL_TEST_BACKEND=cuda KVPOOL_CRASH_POINTS=$points gpu-bundle/run restart_test 2>&1 \
  | tee "$logs/restart.log" | summary
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
gpu-bundle/run kvpool-bench recovery --cuda --json="$out/recovery-h200.json" || status=1

# The decode step through the service, pinned as deploy/ recommends, without and with the log.
for state in none log; do
  dir=$(mktemp -d /tmp/kvpool-bench-XXXXXX)
  flags=(--runtime_dir="$dir" --backend=cuda --gpu=0 --metrics_port=-1 --arena_mib=12288
         --layers=61 --topk=2048)
  [ "$state" = log ] && flags+=(--state_dir="$dir/state")
  taskset -c 2 gpu-bundle/run kvpoold "${flags[@]}" >"$logs/kvpoold-$state.log" 2>&1 &
  daemon=$!
  taskset -c 4 gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=prefill \
    >"$logs/prefill-$state.log" 2>&1 &
  prefill=$!
  taskset -c 6 gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=decode \
    >"$logs/decode-$state.log" 2>&1 &
  decode=$!
  taskset -c 8 gpu-bundle/run kvpoolctl bench-decode --endpoint="ipc://$dir/kvpoold.sock" \
    --device="$device" --batch=64 --context=32768 --steps=50 --outputs=none \
    --placement="one core each; state log: $state" \
    --out="$out/service-decode-state-$state-h200.json" 2>/dev/null || status=1
  [ "$state" = log ] && ls -l "$dir/state" >> "$logs/kvpoold-$state.log"
  kill -TERM "$daemon" "$prefill" "$decode" 2>/dev/null
  wait "$daemon" "$prefill" "$decode" 2>/dev/null
done
exit $status
