#include "kvpool/arena/cuda_driver.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

template <typename Fn>
bool Resolve(const char* symbol, Fn** fn) {
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  void* p = nullptr;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) return false;
  *fn = reinterpret_cast<Fn*>(p);
  return true;
}

absl::StatusOr<CudaDriver> Load() {
  CudaDriver d;
  const bool ok = Resolve("cuGetErrorString", &d.GetErrorString) &&
                  Resolve("cuMemGetAllocationGranularity", &d.MemGetAllocationGranularity) &&
                  Resolve("cuMemCreate", &d.MemCreate) && Resolve("cuMemRelease", &d.MemRelease) &&
                  Resolve("cuMemAddressReserve", &d.MemAddressReserve) &&
                  Resolve("cuMemAddressFree", &d.MemAddressFree) &&
                  Resolve("cuMemMap", &d.MemMap) && Resolve("cuMemUnmap", &d.MemUnmap) &&
                  Resolve("cuMemSetAccess", &d.MemSetAccess) &&
                  Resolve("cuMemExportToShareableHandle", &d.MemExportToShareableHandle) &&
                  Resolve("cuMemImportFromShareableHandle", &d.MemImportFromShareableHandle) &&
                  Resolve("cuMemGetAllocationPropertiesFromHandle",
                          &d.MemGetAllocationPropertiesFromHandle);
  if (!ok) {
    return absl::UnavailableError(
        "the CUDA driver is missing or lacks the virtual memory management entry points");
  }
  return d;
}

}  // namespace

absl::StatusOr<const CudaDriver*> CudaDriver::Get() {
  static const absl::StatusOr<CudaDriver>* driver = new absl::StatusOr<CudaDriver>(Load());
  if (!driver->ok()) return driver->status();
  return &driver->value();
}

absl::Status CuStatus(CUresult result, absl::string_view what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = "unknown error";
  if (auto d = CudaDriver::Get(); d.ok()) (*d)->GetErrorString(result, &text);
  return absl::InternalError(
      absl::StrCat(what, ": CUDA driver error ", static_cast<int>(result), " (", text, ")"));
}

}  // namespace kvp
