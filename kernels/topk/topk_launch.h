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

// How TopkLaunch's search decides a row: after two histogram passes when the bin of the k-th
// largest score's top 24 bits holds no smaller score and no tie; else, when that bin holds at most
// 2,048 scores (1,024 in batches of CTAs of 256 threads) and its 12-bit bin at most an eighth of
// the row, from the candidate lists the second pass wrote (a little more work in each CTA); else
// after a third pass (a third barrier of the row's CTAs, the costliest way).
struct TopkSearch {
  int passes = 0;          // histogram passes, 1 to 3, each ending at a barrier of the row's CTAs
  bool from_list = false;  // the k-th found in the candidate list after the second pass
};

// The search for row `row` of p, whose scores and lengths are in host memory here.
TopkSearch TopkSearchOf(const TopkParams& host, int row);

}  // namespace kvp
