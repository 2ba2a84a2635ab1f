#include "base/status_macros.h"
#include "bench/launch_floor.h"
#include "kernels/common/cuda_status.h"
#include "kernels/common/dependent_launch.cuh"

namespace kvp::bench {
namespace {

// Does nothing but what every attention kernel does at its start: lets the next kernel launch,
// and waits for the one before (a no-op without a programmatic dependent launch).
__global__ void EmptyKernel() {
  LetDependentsLaunch();
  WaitForPredecessor();
}

}  // namespace

absl::Status LaunchEmptyKernel(cudaStream_t stream) {
  KVP_CUDA_RETURN_IF_ERROR(LaunchDependent(EmptyKernel, dim3(kEmptyFirstCtas),
                                           dim3(kEmptyFirstThreads), 0, stream, false));
  return absl::OkStatus();
}

absl::Status LaunchEmptyDependentPair(cudaStream_t stream) {
  RETURN_IF_ERROR(LaunchEmptyKernel(stream));
  KVP_CUDA_RETURN_IF_ERROR(LaunchDependent(EmptyKernel, dim3(kEmptySecondCtas),
                                           dim3(kEmptySecondThreads), 0, stream, false));
  return absl::OkStatus();
}

}  // namespace kvp::bench
