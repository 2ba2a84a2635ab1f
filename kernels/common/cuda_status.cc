#include "kernels/common/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace kvp {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

absl::Status LaunchToStatus(const LaunchStatus& launch, absl::string_view op) {
  if (launch.unsupported != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": the CUDA kernels do not support ", launch.unsupported));
  }
  return CudaStatus(launch.cuda, absl::StrCat("launching ", op));
}

}  // namespace kvp
