// CUDA launchers of the MLA cache write (bytes identical to MlaCacheWriteRef) and sparse MLA
// decode (within float rounding of SparseMlaDecodeRef). nvcc-safe; all pointers device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/launch_status.h"
#include "kernels/mla/mla_params.h"

namespace kvp {

LaunchStatus MlaCacheWriteLaunch(const MlaCacheWriteParams& p, cudaStream_t stream);

// REQUIRES: every position < 0 or inside its row's block table (what top-k selects).
LaunchStatus SlotsOfPositionsLaunch(const SlotsOfPositionsParams& p, cudaStream_t stream);

// Heads a multiple of 16 (16, 32, 64, 128); slots are not checked (the caller's top-k is).
LaunchStatus SparseMlaDecodeLaunch(const SparseMlaDecodeParams& p, cudaStream_t stream);

}  // namespace kvp
