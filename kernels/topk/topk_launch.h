// CUDA launcher of top-k (nvcc-safe): exactly the contract of topk_params.h, so its output equals
// TopkRef's element for element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/common/launch_status.h"
#include "kernels/topk/topk_params.h"

namespace kvp {

struct TopkWorkspaceSizes {
  size_t scratch_bytes = 0;  // any contents; rewritten by every launch
  size_t counter_bytes = 0;  // all zero before a launch; the launch leaves them zero
};

// Device memory for one launch. `counters` must be all zero before the first launch (zero it when
// allocating); every launch leaves it zero again, so it needs no clearing in between.
struct TopkWorkspace {
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  void* counters = nullptr;
  size_t counter_bytes = 0;
};

TopkWorkspaceSizes TopkWorkspaceBytes(const TopkParams& p);

LaunchStatus TopkLaunch(const TopkParams& p, const TopkWorkspace& workspace, cudaStream_t stream);

// How many histogram passes (1 to 3) TopkLaunch's search takes for row `row` of p, whose scores
// and lengths are in host memory here. Two when the bin of the k-th largest score's top 24 bits
// holds no smaller score; a third pass (about 4 us on an H200 at 163,840 scores) otherwise.
int TopkSearchPasses(const TopkParams& host, int row);

}  // namespace kvp
