#!/usr/bin/env bash
# The main job: starts kvpoold with one prefill and one decode worker (cuda backend when a GPU is
# visible, host otherwise), runs the synthetic workload through them with kvpoolctl bench, stops
# everything and exits with the workload's status. --pool_kind=mla serves DeepSeek's MLA latent
# cache instead of FP8 K + TurboNV V (128 query heads on a GPU, 16 on the host backend, whose CPU
# reference kernels are slow); other arguments go to kvpoolctl bench.
#   scripts/service-demo.sh [--pool_kind=mla] [--sequences=16 --prompt=2048 --decode_steps=64 ...]
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

daemon_flags=() bench_flags=()
for arg in "$@"; do
  case "$arg" in
    --pool_kind=mla)
      heads=16
      nvidia-smi -L >/dev/null 2>&1 && heads=128
      daemon_flags+=("$arg" --q_heads=$heads) ;;
    --pool_kind=*) daemon_flags+=("$arg") ;;
    *) bench_flags+=("$arg") ;;
  esac
done

echo "service-demo: kvpoold + prefill worker + decode worker, logs in $dir/*.log"
"$bin/daemon/kvpoold" --runtime_dir="$dir" --backend=auto --arena_mib=2048 --layers=4 --topk=256 \
  --metrics_port=-1 ${daemon_flags[@]+"${daemon_flags[@]}"} >"$dir/kvpoold.log" 2>&1 &
pids+=($!)
for role in prefill decode; do
  "$bin/worker/kvpool-worker" --runtime_dir="$dir" --role=$role >"$dir/$role.log" 2>&1 &
  pids+=($!)
done
status=0
"$bin/client/kvpoolctl" bench --endpoint="ipc://$dir/kvpoold.sock" ${bench_flags[@]+"${bench_flags[@]}"} \
  || status=$?
grep -h "backend=" "$dir"/decode.log | sed 's/^/service-demo: /' | tail -1 || true
stop_all || status=1
[ $status -eq 0 ] && echo "service-demo: kvpoold and both workers stopped cleanly"
exit $status
