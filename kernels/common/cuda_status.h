// CUDA errors as absl::Status: the one place they are converted.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/common/launch_status.h"

namespace kvp {

// OK, or INTERNAL naming `what`, the CUDA error and its text.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

// A launcher's result: UNIMPLEMENTED naming the missing capability of `op`, or CudaStatus.
absl::Status LaunchToStatus(const LaunchStatus& launch, absl::string_view op);

}  // namespace kvp

// Returns INTERNAL from the enclosing function when the CUDA call `expr` fails; the message
// carries the expression and file:line.
#define KVP_CUDA_RETURN_IF_ERROR(expr)                                                        \
  do {                                                                                        \
    const cudaError_t kvp_cuda_error_ = (expr);                                               \
    if (kvp_cuda_error_ != cudaSuccess) {                                                     \
      return ::kvp::CudaStatus(kvp_cuda_error_, #expr " at " __FILE__ ":" KVP_CUDA_LINE_STR); \
    }                                                                                         \
  } while (0)
#define KVP_CUDA_STR_INNER(x) #x
#define KVP_CUDA_STR(x) KVP_CUDA_STR_INNER(x)
#define KVP_CUDA_LINE_STR KVP_CUDA_STR(__LINE__)
