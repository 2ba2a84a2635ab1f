// kvpool-bench kernels --only=mla: DeepSeek MLA over an fp8_ds_mla cache of 163,840 tokens
// (kernels/mla/): the latent write, sparse decode through a top-2048 at FlashMLA's shapes, and a
// whole DeepSeek-V3.2 decode layer at batch 1 (indexer -> top-k -> slots -> sparse MLA decode).
// TFLOP/s counts 2 · (576 + 512) flops per query head and selected token.
#pragma once

#include <cuda_runtime_api.h>

#include <random>

#include "absl/status/status.h"
#include "bench/kernel_bench.h"

namespace kvp::bench {

// Appends the MLA rows to `report`; `quick` shrinks the cache and skips the batch-128 shapes.
absl::Status MeasureMlaKernels(cudaStream_t stream, bool quick, std::mt19937_64& rng,
                               KernelReport& report);

}  // namespace kvp::bench
