#include "worker/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

constexpr int kOldestVersion = 21900;  // non-blocking communicators

absl::StatusOr<NcclLibrary> Load() {
  const char* chosen = std::getenv("KVPOOL_NCCL_LIBRARY");
  const std::string path = chosen != nullptr && *chosen != '\0' ? chosen : "libnccl.so.2";
  // Never closed: communicators and their proxy threads live as long as the process.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::UnimplementedError(absl::StrCat("NCCL is not available: dlopen ", path, ": ",
                                                 ::dlerror(), " (set KVPOOL_NCCL_LIBRARY)"));
  }
  NcclLibrary nccl;
  nccl.path = path;
  absl::Status missing = absl::OkStatus();
  const auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
    if (fn == nullptr && missing.ok()) {
      missing = absl::UnimplementedError(absl::StrCat(path, " has no ", name));
    }
  };
  ncclResult_t (*get_version)(int*) = nullptr;
  bind(get_version, "ncclGetVersion");
  bind(nccl.GetUniqueId, "ncclGetUniqueId");
  bind(nccl.CommInitRankConfig, "ncclCommInitRankConfig");
  bind(nccl.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(nccl.CommAbort, "ncclCommAbort");
  bind(nccl.Send, "ncclSend");
  bind(nccl.Recv, "ncclRecv");
  bind(nccl.GroupStart, "ncclGroupStart");
  bind(nccl.GroupEnd, "ncclGroupEnd");
  bind(nccl.GetErrorString, "ncclGetErrorString");
  bind(nccl.GetLastError, "ncclGetLastError");
  if (!missing.ok()) return missing;
  if (get_version(&nccl.version) != ncclSuccess || nccl.version < kOldestVersion) {
    return absl::UnimplementedError(absl::StrCat(path, " is NCCL ", nccl.version,
                                                 "; kvpool needs ", kOldestVersion, " or newer"));
  }
  return nccl;
}

}  // namespace

std::string NcclLibrary::Describe(ncclResult_t result, ncclComm_t comm) const {
  const char* last = GetLastError(comm);
  return absl::StrCat(GetErrorString(result), last != nullptr && *last != '\0' ? ": " : "",
                      last != nullptr ? last : "");
}

absl::StatusOr<const NcclLibrary*> LoadNccl() {
  static const absl::StatusOr<NcclLibrary>* loaded = new absl::StatusOr<NcclLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace kvp
