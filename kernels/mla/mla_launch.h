// CUDA launchers of the MLA cache write (bytes identical to MlaCacheWriteRef) and sparse MLA
// decode (within float rounding of SparseMlaDecodeRef). nvcc-safe; all pointers device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/launch_status.h"
#include "kernels/mla/mla_params.h"

namespace kvp {

LaunchStatus MlaCacheWriteLaunch(const MlaCacheWriteParams& p, cudaStream_t stream);

// REQUIRES: every position < 0 or inside its row's block table (what top-k selects).
LaunchStatus SlotsOfPositionsLaunch(const SlotsOfPositionsParams& p, cudaStream_t stream);

// Heads a multiple of 16 (16, 32, 64, 128); slots are not checked (the caller's top-k is). When
// the rows are too few to fill the GPU the top-k is split across CTAs, whose partial results
// take SparseMlaDecodeWorkspaceBytes(p) of workspace (0: none needed).
size_t SparseMlaDecodeWorkspaceBytes(const SparseMlaDecodeParams& p);
LaunchStatus SparseMlaDecodeLaunch(const SparseMlaDecodeParams& p, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);

}  // namespace kvp
