// The CUDA driver calls the cuda arena needs, reached through cudaGetDriverEntryPointByVersion so
// no binary links libcuda (docs/design.md §2: they start on machines without a GPU driver).
// Resolved once, on first use.
#pragma once

#include <cuda.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvp {

struct CudaDriver {
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*MemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                          CUmemAllocationGranularity_flags);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                        unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*MemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                         CUmemAllocationHandleType, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                           CUmemAllocationHandleType);
  CUresult (*MemGetAllocationPropertiesFromHandle)(CUmemAllocationProp*,
                                                   CUmemGenericAllocationHandle);

  // UNAVAILABLE when there is no driver or it lacks an entry point.
  static absl::StatusOr<const CudaDriver*> Get();
};

// OK, or INTERNAL naming `what` and the driver's error.
absl::Status CuStatus(CUresult result, absl::string_view what);

}  // namespace kvp

#define KVP_CU_RETURN_IF_ERROR(driver_call, what)                          \
  do {                                                                     \
    if (const CUresult kvp_cu_ = (driver_call); kvp_cu_ != CUDA_SUCCESS) { \
      return ::kvp::CuStatus(kvp_cu_, what);                               \
    }                                                                      \
  } while (0)
