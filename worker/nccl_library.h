// NCCL, loaded at run time (dlopen of libnccl.so.2, or $KVPOOL_NCCL_LIBRARY): kvpool's binaries
// start, and serve every other transport, on machines without NCCL, as they do without a GPU
// driver; a worker that cannot load it does not offer the nccl transport and kvpoold never picks
// it there (docs/design.md §6). Built against the nccl.h of the CUDA toolkit (2.28); the library
// found must be 2.19 or newer (non-blocking communicators with ncclCommInitRankConfig).
#pragma once

#include <nccl.h>

#include <string>

#include "absl/status/statusor.h"

namespace kvp {

struct NcclLibrary {
  int version = 0;  // NCCL_VERSION_CODE of the library loaded, e.g. 22803
  std::string path;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;

  // "<error string>: <last error>" of a failed call on `comm` (nullptr: none yet).
  std::string Describe(ncclResult_t result, ncclComm_t comm) const;
};

// The library, loaded once (later calls return the first call's result). UNIMPLEMENTED naming
// what was tried when it is missing, too old or lacks a symbol.
absl::StatusOr<const NcclLibrary*> LoadNccl();

}  // namespace kvp
