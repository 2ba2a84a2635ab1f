// CUDA launcher of sparse decode (nvcc-safe): attention over the top-k positions only; same formats
// and options as dense paged decode.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/launch_status.h"
#include "kernels/sparse_decode/sparse_decode_params.h"

namespace kvp {

size_t SparseDecodeWorkspaceBytes(const SparseDecodeParams& p);

LaunchStatus SparseDecodeLaunch(const SparseDecodeParams& p, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);

}  // namespace kvp
