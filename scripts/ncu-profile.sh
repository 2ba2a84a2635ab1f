#!/usr/bin/env bash
# On a GPU host with gpu-bundle/: profiles one launch of the kernels matching REGEX inside
# `kvpool-bench kernels` with Nsight Compute (clocks left alone) and prints where warps stall.
#   scripts/ncu-profile.sh REGEX [LAUNCHES_TO_SKIP] [kvpool-bench options...]
set -uo pipefail
regex=$1
skip=${2:-10}
shift $(( $# >= 2 ? 2 : 1 ))
stall=smsp__average_warps_issue_stalled
metrics=gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum
metrics+=,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size
for reason in long_scoreboard short_scoreboard barrier wait math_pipe_throttle mio_throttle \
              lg_throttle not_selected selected dispatch_stall no_instruction membar; do
  metrics+=",${stall}_${reason}_per_issue_active.ratio"
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
gpu-bundle/run "$ncu" --clock-control none -k "regex:$regex" --launch-skip "$skip" --launch-count 1 \
  --metrics "$metrics" gpu-bundle/bin/kvpool-bench kernels "$@" 2>&1 |
  grep -E "^  [A-Za-z_].*\(|gpu__|sm__|dram__|smsp__|launch__" | sed -E "s/${stall}_//; s/_per_issue_active.ratio//"
