#include "daemon/fd_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvp {

std::string ChunkFdName(uint64_t pool_id, size_t chunk) {
  return absl::StrFormat("kvpool-%016x-%d", pool_id, chunk);
}

FdStore FdStore::FromEnvironment() {
  FdStore store;
  const char* notify = std::getenv("NOTIFY_SOCKET");
  store.available_ = notify != nullptr && notify[0] != '\0';
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  if (n < 0) spdlog::warn("reading the fds passed at start: {}", std::strerror(-n));
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    const std::string name = names != nullptr && names[i] != nullptr ? names[i] : "unknown";
    store.passed_[name] = UniqueFd(fd);
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  return store;
}

absl::Status FdStore::Store(const std::string& name, int fd) {
  if (!available_) return absl::UnavailableError("no fd store (NOTIFY_SOCKET is not set)");
  const std::string message = absl::StrCat("FDSTORE=1\nFDNAME=", name);
  const int r = sd_pid_notify_with_fds(0, 0, message.c_str(), &fd, 1);
  if (r <= 0) {
    return absl::InternalError(absl::StrCat("storing fd ", name, " in systemd's fd store: ",
                                            r == 0 ? "no store" : std::strerror(-r)));
  }
  return absl::OkStatus();
}

void FdStore::Remove(const std::string& name) {
  if (!available_) return;
  const std::string message = absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name);
  sd_notify(0, message.c_str());
}

std::optional<UniqueFd> FdStore::Take(const std::string& name) {
  auto it = passed_.find(name);
  if (it == passed_.end()) return std::nullopt;
  UniqueFd fd = std::move(it->second);
  passed_.erase(it);
  return fd;
}

std::vector<std::string> FdStore::Untaken() const {
  std::vector<std::string> names;
  for (const auto& [name, fd] : passed_) names.push_back(name);
  return names;
}

void FdStore::RemoveUntaken() {
  for (const auto& [name, fd] : passed_) Remove(name);
  passed_.clear();
}

}  // namespace kvp
