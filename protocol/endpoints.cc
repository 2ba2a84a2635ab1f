#include "protocol/endpoints.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

}  // namespace

std::string DefaultRuntimeDir() {
  if (const char* dir = Env("KVPOOL_RUNTIME_DIR")) return dir;
  if (const char* dir = Env("RUNTIME_DIRECTORY")) return dir;
  if (::geteuid() == 0) return "/run/kvpool";
  if (const char* dir = Env("XDG_RUNTIME_DIR")) return absl::StrCat(dir, "/kvpool");
  return absl::StrCat("/tmp/kvpool-", ::geteuid());
}

std::string EndpointIn(const std::string& runtime_dir) {
  return absl::StrCat("ipc://", runtime_dir, "/kvpoold.sock");
}

std::string FdChannelIn(const std::string& runtime_dir, int pool) {
  if (pool == 0) return absl::StrCat(runtime_dir, "/kvpoold.fds");
  return absl::StrCat(runtime_dir, "/kvpoold-", pool, ".fds");
}

std::string ReturnChannelIn(const std::string& runtime_dir) {
  return absl::StrCat(runtime_dir, "/kvpoold-return.fds");
}

std::string ReturnChannelBeside(const std::string& fd_channel) {
  return ReturnChannelIn(std::filesystem::path(fd_channel).parent_path().string());
}

absl::Status PrepareRuntimeDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the runtime directory ", dir, ": ", ec.message()));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("stat ", dir, ": ", std::strerror(errno)));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the runtime directory ", dir, " belongs to uid ", st.st_uid, ", not us"));
  }
  if (::chmod(dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("chmod ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kvp
