// The fd channel (docs/design.md §2, §8): an AF_UNIX SOCK_SEQPACKET socket over which kvpoold hands
// its arena's file descriptors (SCM_RIGHTS) and description to attaching processes. A peer is
// admitted only when its SO_PEERCRED uid or gid is on the allow-list; a refused peer gets an error
// message and never an fd. After the arena the connection can carry small application messages
// (Send/Receive); kvpoold closes it once the arena is handed over, since workers heartbeat over
// ZeroMQ and leases tell it when a peer is gone.
//
// Messages are one datagram each: a type byte, then the payload.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvpool/arena/arena_description.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct AllowList {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  bool Allows(const PeerCredentials& peer) const;
};

// One connected process, on either side.
class FdPeer {
 public:
  FdPeer() = default;
  FdPeer(UniqueFd fd, PeerCredentials creds) : fd_(std::move(fd)), creds_(creds) {}

  const PeerCredentials& credentials() const { return creds_; }
  int fd() const { return fd_.get(); }

  absl::Status SendArena(const ArenaDescription& description, absl::Span<const int> fds);
  // Tells the peer why it gets nothing (code and message of `status`).
  absl::Status SendError(const absl::Status& status);
  // An application message (heartbeat, acknowledgement); at most 64 KiB.
  absl::Status Send(absl::string_view message);

  // The next application message. DEADLINE_EXCEEDED after timeout_ms (-1: wait forever);
  // UNAVAILABLE when the peer has gone; the peer's error when it sent one.
  absl::StatusOr<std::string> Receive(int timeout_ms);

  // Waits for the arena message: its description and fds (owned).
  absl::StatusOr<std::pair<ArenaDescription, std::vector<UniqueFd>>> ReceiveArena(int timeout_ms);

 private:
  UniqueFd fd_;
  PeerCredentials creds_;
};

class FdChannelServer {
 public:
  // Binds `path` (a stale socket there is replaced) with mode 0600 and listens. It narrows the
  // process umask for the bind, so call it before other threads create files.
  static absl::StatusOr<FdChannelServer> Listen(const std::string& path, AllowList allow);
  FdChannelServer() = default;
  FdChannelServer(FdChannelServer&&) = default;
  FdChannelServer& operator=(FdChannelServer&&) = default;
  ~FdChannelServer();

  // The next admitted peer. A peer off the allow-list is sent PERMISSION_DENIED and dropped,
  // and that status is returned. DEADLINE_EXCEEDED after timeout_ms (-1: wait forever).
  absl::StatusOr<FdPeer> Accept(int timeout_ms);

  const std::string& path() const { return path_; }
  int fd() const { return listener_.get(); }  // readable when a peer is waiting (for poll)

 private:
  UniqueFd listener_;
  std::string path_;
  AllowList allow_;
};

// Connects to kvpoold's fd channel at `path`.
absl::StatusOr<FdPeer> ConnectFdChannel(const std::string& path);

}  // namespace kvp
