// Timing device work with CUDA events: warm-up runs, then the median of many timed runs.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "bench/l2_eviction.h"
#include "kernels/common/cuda_status.h"

namespace kvp::bench {

struct Timing {
  double median_us = 0.0;
  double min_us = 0.0;
  int runs = 0;
};

// `run(i)` enqueues iteration i on `stream` (rotate inputs with i to stay out of L2). Before each
// timed run the stream reads a 256 MiB buffer (EvictL2): nothing of the inputs stays in L2, nothing
// dirty is left for the run to write back, and the GPU is busy while the host enqueues the run, so
// launch latency does not land between the events.
inline absl::StatusOr<Timing> TimeMedian(const std::function<absl::Status(int)>& run,
                                         cudaStream_t stream, int warmup = 5, int runs = 50) {
  cudaEvent_t start, stop;
  KVP_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  KVP_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> us;
  absl::Status status;
  for (int i = 0; i < warmup + runs && status.ok(); ++i) {
    RETURN_IF_ERROR(EvictL2(stream));
    KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    status = run(i);
    KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    KVP_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0.0f;
    KVP_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    if (i >= warmup) us.push_back(ms * 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  std::sort(us.begin(), us.end());
  return Timing{us[us.size() / 2], us.front(), runs};
}

}  // namespace kvp::bench
