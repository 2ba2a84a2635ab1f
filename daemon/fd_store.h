// systemd's file descriptor store (docs/design.md §10): kvpoold keeps each arena chunk's fd there
// (sd_pid_notify_with_fds "FDSTORE=1"), so the memory outlives kvpoold even with no worker
// attached, and a restarted kvpoold gets the fds back at start as LISTEN_FDS named by
// LISTEN_FDNAMES. Needs FileDescriptorStoreMax= in the unit (deploy/systemd/kvpoold.service).
// Anything that speaks the same protocol can stand in for systemd (the tests do).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp {

class FdStore {
 public:
  // Takes the named fds passed at start, and unsets LISTEN_FDS so no child inherits them.
  static FdStore FromEnvironment();

  // True when there is a store to keep fds in (NOTIFY_SOCKET is set).
  bool available() const { return available_; }

  // Keeps a duplicate of `fd` in the store under `name` (the caller keeps `fd`). UNAVAILABLE
  // without a store; INTERNAL when systemd refuses it (FileDescriptorStoreMax= too small).
  absl::Status Store(const std::string& name, int fd);
  // Drops `name` from the store (a chunk of an arena that is no more).
  void Remove(const std::string& name);

  // The fd passed at start under `name` (nullopt when there is none); it stays in the store.
  std::optional<UniqueFd> Take(const std::string& name);
  // The names passed at start and not taken.
  std::vector<std::string> Untaken() const;
  // Removes every fd passed at start that was not taken from the store, and closes it.
  void RemoveUntaken();

 private:
  bool available_ = false;
  absl::flat_hash_map<std::string, UniqueFd> passed_;
};

// The name of chunk `chunk` of the pool with id `pool_id`: what the store knows it by.
std::string ChunkFdName(uint64_t pool_id, size_t chunk);

}  // namespace kvp
