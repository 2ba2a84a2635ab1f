// CUDA launchers of block gather (arena -> staging), scatter (staging -> arena) and move (arena ->
// arena), nvcc-safe.
// Block ids are trusted here: the host checks them against the arena before launching.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/block_copy/block_copy_params.h"
#include "kernels/common/launch_status.h"

namespace kvp {

LaunchStatus GatherBlocksLaunch(const BlockCopyParams& p, cudaStream_t stream);
LaunchStatus ScatterBlocksLaunch(const BlockCopyParams& p, cudaStream_t stream);
LaunchStatus MoveBlocksLaunch(const BlockMoveParams& p, cudaStream_t stream);

}  // namespace kvp
