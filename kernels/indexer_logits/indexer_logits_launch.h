// CUDA launcher of the lightning-indexer logits (nvcc-safe): 64 heads x 128, FP8 index keys.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/launch_status.h"
#include "kernels/indexer_logits/indexer_logits_params.h"

namespace kvp {

LaunchStatus IndexerLogitsLaunch(const IndexerLogitsParams& p, cudaStream_t stream);

}  // namespace kvp
