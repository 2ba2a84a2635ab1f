#!/usr/bin/env bash
# The main job: starts kvpoold with one prefill and one decode worker (cuda backend when a GPU is
# visible, host otherwise), runs the synthetic workload through them with kvpoolctl bench, stops
# everything and exits with the workload's status. Extra arguments go to kvpoolctl bench.
#   scripts/service-demo.sh [--sequences=16 --prompt=2048 --decode_steps=64 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KVP_BUILD_DIR:-build}
dir=$(mktemp -d /tmp/kvpool-demo-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
# Stops the processes with SIGTERM as an operator would; each must exit 0.
stop_all() {
  local failed=0
  for pid in "${pids[@]}"; do kill -TERM "$pid"; done
  for pid in "${pids[@]}"; do
    if ! wait "$pid"; then
      echo "service-demo: process $pid did not exit cleanly; logs in $dir" >&2
      failed=1
    fi
  done
  pids=()
  return $failed
}

echo "service-demo: kvpoold + prefill worker + decode worker, logs in $dir/*.log"
"$bin/daemon/kvpoold" --runtime_dir="$dir" --backend=auto --arena_mib=2048 --layers=4 --topk=256 \
  --metrics_port=-1 >"$dir/kvpoold.log" 2>&1 &
pids+=($!)
for role in prefill decode; do
  "$bin/worker/kvpool-worker" --runtime_dir="$dir" --role=$role >"$dir/$role.log" 2>&1 &
  pids+=($!)
done
status=0
"$bin/client/kvpoolctl" bench --endpoint="ipc://$dir/kvpoold.sock" "$@" || status=$?
grep -h "backend=" "$dir"/decode.log | sed 's/^/service-demo: /' | tail -1 || true
stop_all || status=1
[ $status -eq 0 ] && echo "service-demo: kvpoold and both workers stopped cleanly"
exit $status
