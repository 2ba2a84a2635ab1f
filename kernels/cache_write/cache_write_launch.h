// CUDA launcher of the cache write (nvcc-safe). Bytes identical to CacheWriteRef.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cache_write/cache_write_params.h"
#include "kernels/common/launch_status.h"

namespace kvp {

// All pointers in `p` are device pointers. Supports K fp8_e4m3 or bf16, V turbo2/3/4 or bf16,
// head_dim 64/128/256; anything else is reported as unsupported.
LaunchStatus CacheWriteLaunch(const CacheWriteParams& p, cudaStream_t stream);

}  // namespace kvp
