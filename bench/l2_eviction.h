// Evicting the GPU's L2 cache between timed runs, with clean lines.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace kvp::bench {

// Reads a 256 MiB buffer (allocated on first use) on `stream`. Afterwards L2 holds only clean lines
// of that buffer: the next kernel finds none of its inputs cached and pays for no write-back of
// someone else's data (a memset would leave L2 full of dirty lines, and a short kernel would spend
// much of its time writing them back). The read also keeps the GPU busy while the host enqueues.
absl::Status EvictL2(cudaStream_t stream);

}  // namespace kvp::bench
