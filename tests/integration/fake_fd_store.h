// What systemd does for kvpoold's fd store (daemon/fd_store.h), for tests: a NOTIFY_SOCKET that
// keeps the fds sent with FDSTORE=1 under their FDNAME (and drops them on FDSTOREREMOVE=1), and
// the environment that passes them to the next kvpoold as LISTEN_FDS. Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp::testing {

class FakeFdStore {
 public:
  // Listens on `socket_path` (a datagram socket).
  static absl::StatusOr<std::unique_ptr<FakeFdStore>> Listen(const std::string& socket_path);
  ~FakeFdStore();

  const std::string& socket_path() const { return path_; }
  // Waits until every message sent so far has been read (the socket is empty).
  void Drain();
  std::vector<std::string> names();
  // The stored fds, in name order, and their names joined by ':' (LISTEN_FDNAMES).
  std::vector<int> fds();
  std::string joined_names();
  void Clear();

 private:
  FakeFdStore() = default;
  void Serve();
  bool ReadOne(int timeout_ms);  // true when a message was read

  std::string path_;
  UniqueFd socket_;
  std::mutex mu_;
  std::map<std::string, UniqueFd> stored_;
  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

}  // namespace kvp::testing
