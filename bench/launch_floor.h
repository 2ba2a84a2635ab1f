// What timing a launch costs in this harness before a kernel does anything: empty kernels between
// the same events, after the same L2 eviction, as the kernel rows are timed.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace kvp::bench {

// One empty kernel of 256 CTAs of 128 threads (as many as sparse decode of 128/1 heads launches at
// batch 1), launched as the attention kernels are (a programmatic dependent launch).
absl::Status LaunchEmptyKernel(cudaStream_t stream);

// Two empty kernels launched the way the attention kernels are: 256 CTAs of 128 threads, then 128
// CTAs of 512 threads as a programmatic dependent launch whose CTAs wait for the first kernel
// (dependent_launch.cuh), as a combining kernel waits for the parts.
absl::Status LaunchEmptyDependentPair(cudaStream_t stream);

}  // namespace kvp::bench
