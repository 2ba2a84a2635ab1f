// CUDA launcher of dense paged decode (nvcc-safe): FP8 K, TurboNV V, head_dim 64/128/256,
// 1-16 q heads per kv head (more in tiles of 16), block sizes 16/32/64, window, sparse-V.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/launch_status.h"
#include "kernels/paged_decode/paged_decode_params.h"

namespace kvp {

// Device scratch the launch needs for `p` (split partial results); depends on p.max_seq_len.
size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p);

LaunchStatus PagedDecodeLaunch(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace kvp
