// What timing a launch costs in this harness before a kernel does anything: empty kernels between
// the same events, after the same L2 eviction, as the kernel rows are timed.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace kvp::bench {

// The grids of sparse decode of 128/1 heads at batch 1: its parts kernel, then its combining
// kernel.
inline constexpr int kEmptyFirstCtas = 256, kEmptyFirstThreads = 128;
inline constexpr int kEmptySecondCtas = 128, kEmptySecondThreads = 512;

// One empty kernel of the first grid, launched as the attention kernels are (a programmatic
// dependent launch).
absl::Status LaunchEmptyKernel(cudaStream_t stream);

// That kernel, then one of the second grid as a programmatic dependent launch whose CTAs wait for
// the first (dependent_launch.cuh), as a combining kernel waits for the parts.
absl::Status LaunchEmptyDependentPair(cudaStream_t stream);

}  // namespace kvp::bench
