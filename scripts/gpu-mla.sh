#!/usr/bin/env bash
# Runs on a GPU host, from the repository root, with gpu-bundle/ beside it (scripts/gpu-bundle.sh):
# what MLA pools need measured and checked on the GPU, in one call:
#   - the GPU kernel and executor tests (all of cuda_kernels_test: MLA and the K/V kernels that
#     share the index-key write) and the service on the cuda backend for both pool kinds,
#   - `kvpool-bench kernels --only=mla` beside the PyTorch MLA baselines, merged (kernels-mla-h200.json),
#   - a 61-layer DeepSeek-V3.2-shaped MLA pool through the service: kvpoolctl bench-decode at batch
#     64 and 32k context, with the last layer's outputs and without (service-decode-mla*-h200.json).
# OUT_DIR ends with those results, table.md and gpu-mla.log (every step's output).
#   scripts/gpu-mla.sh OUT_DIR [STEPS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
out=$1
steps=${2:-10}
mkdir -p "$out"
here=$PWD/gpu-bundle
export KVPOOLD_BIN=$here/bin/kvpoold KVPOOL_WORKER_BIN=$here/bin/kvpool-worker
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
status=0
summary() { grep -E "^\[  (PASSED|FAILED)|FAILED \]|Failure|Expected|Which is|actual|error" | head -40; }

gpu-bundle/run cuda_kernels_test 2>&1 | tee "$out/kernels-tests.log" | summary
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
gpu-bundle/run service_gpu_test --gtest_filter='*Flow*' 2>&1 | tee "$out/service-tests.log" | summary
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

gpu-bundle/run kvpool-bench kernels --only=mla --json="$out/kernels.json" 2>&1 | tee "$out/kernels.log" || status=1
python3 bench/torch_baselines.py --only=mla --json="$out/torch.json" 2>&1 | tee "$out/torch.log" || status=1
python3 bench/report.py "$out/kernels.json" "$out/torch.json" "$out/kernels-mla-h200.json" | tee "$out/table.md" || status=1

dir=$(mktemp -d /tmp/kvpool-mla-XXXXXX)
gpu-bundle/run kvpoold --runtime_dir="$dir" --backend=cuda --gpu=0 --metrics_port=-1 \
  --pool_kind=mla --layers=61 --q_heads=128 --topk=2048 --arena_mib=12288 >"$out/kvpoold.log" 2>&1 &
daemon=$!
gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=prefill >"$out/prefill.log" 2>&1 &
prefill=$!
gpu-bundle/run kvpool-worker --runtime_dir="$dir" --role=decode >"$out/decode.log" 2>&1 &
decode=$!
# The last layer's outputs returned (what a client inspecting them gets), then lengths only (what a
# full model's decode step returns).
for outputs in last none; do
  suffix=$([ $outputs = last ] && echo "" || echo "-none")
  gpu-bundle/run kvpoolctl bench-decode --endpoint="ipc://$dir/kvpoold.sock" --device="$device" \
    --pool_kind=mla --batch=64 --context=32768 --steps="$steps" --outputs=$outputs \
    --out="$out/service-decode-mla$suffix-h200.json" 2>&1 | tail -7 || status=1
done
kill -TERM "$daemon" "$prefill" "$decode" 2>/dev/null
wait "$daemon" "$prefill" "$decode" 2>/dev/null
tail -n 5 "$out"/kvpoold.log "$out"/decode.log
# What a caller fetches: the results, the table, and one log (a device run returns few files).
for log in kernels-tests service-tests kernels torch kvpoold prefill decode; do
  printf '==> %s.log <==\n' "$log"
  cat "$out/$log.log"
done >"$out/gpu-mla.log"
(cd "$out" && rm -f kernels.json torch.json kernels-tests.log service-tests.log \
  kernels.log torch.log kvpoold.log prefill.log decode.log)
exit $status
