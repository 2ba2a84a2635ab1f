// What a CUDA launcher reports back to host code, without Abseil (nvcc never sees it):
// a CUDA error, or the name of a capability the kernels lack (-> UNIMPLEMENTED).
#pragma once

#include <cuda_runtime_api.h>

namespace kvp {

struct LaunchStatus {
  cudaError_t cuda = cudaSuccess;
  const char* unsupported = nullptr;  // static text naming what is missing, e.g. "head_dim 96"

  bool ok() const { return cuda == cudaSuccess && unsupported == nullptr; }
};

inline LaunchStatus Unsupported(const char* what) { return LaunchStatus{cudaSuccess, what}; }
inline LaunchStatus LastLaunchError() { return LaunchStatus{cudaGetLastError(), nullptr}; }

}  // namespace kvp
