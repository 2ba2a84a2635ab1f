// CUDA launcher of top-k (nvcc-safe): exactly the contract of topk_params.h, so its output equals
// TopkRef's element for element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/launch_status.h"
#include "kernels/topk/topk_params.h"

namespace kvp {

size_t TopkWorkspaceBytes(const TopkParams& p);

LaunchStatus TopkLaunch(const TopkParams& p, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);

}  // namespace kvp
