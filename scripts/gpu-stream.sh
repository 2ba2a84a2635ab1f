#!/usr/bin/env bash
# Runs on a GPU host, from the repository root, with gpu-bundle/ beside it (scripts/gpu-bundle.sh):
# kvpoolctl bench-stream on two pools of GPU 0 (peer copy): a long prefill on pool 0 decoded on
# pool 1, written whole and moved after, against written in slices whose blocks stream to pool 1
# while the next slice is written. GPUS: the two pools' GPUs (default 0,0: both on GPU 0, by peer
# copy; 0,1 on a two-GPU host: peer copy over NVLink, or NCCL). Writes
# OUT_DIR/stream-l{4,61}-c{4096,16384}-h200.json (0,0) or -h200x2.json: two pool depths, slices
# of 4,096 and 16,384 tokens.
#   scripts/gpu-stream.sh OUT_DIR [GPUS]
set -uo pipefail
out=$1
gpus=${2:-0,0}
gpu_of=(${gpus//,/ })
suffix=h200
[ "${gpu_of[0]}" = "${gpu_of[1]}" ] || suffix=h200x2
mkdir -p "$out"
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
logs=$(mktemp -d /tmp/kvpool-logs-XXXXXX)
trap 'tail -n 20 "$logs"/* > "$out/stream-logs.txt" 2>&1' EXIT
status=0
# Two pools, a prefill and a decode worker on each (kvpoold is ready with both roles on every
# pool); the bench prefills on pool 0 for pool 1. Two shapes: the main job's 4 layers, and
# 61 layers (a DeepSeek-V3-deep pool: 15x the bytes per token).
for layers in 4 61; do
  dir=$(mktemp -d /tmp/kvpool-bench-XXXXXX)
  gpu-bundle/run kvpoold --runtime_dir="$dir" --backend=cuda --gpus="$gpus" --arena_mib=16384 \
    --layers=$layers --topk=256 --metrics_port=-1 >"$logs/kvpoold-$layers.log" 2>&1 &
  pids=($!)
  for pool in 0 1; do
    for role in prefill decode; do
      gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=$role --gpu="${gpu_of[$pool]}" --pool=$pool \
        >"$logs/$role$pool-$layers.log" 2>&1 &
      pids+=($!)
    done
  done
  for chunk in 4096 16384; do
    gpu-bundle/run kvpoolctl bench-stream --endpoint="ipc://$dir/kvpoold.sock" --device="$device" \
      --context=32768 --chunk_tokens=$chunk --runs=5 \
      --out="$out/stream-l$layers-c$chunk-$suffix.json" 2>"$logs/bench-$layers-$chunk.log" || status=1
  done
  kill -TERM "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
done
exit $status
