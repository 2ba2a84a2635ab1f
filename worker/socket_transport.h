// The socket transport of paired moves (docs/design.md §6) between host pools, on one node or
// across nodes: the receiver listens on an ephemeral TCP port of its transfer address and reports
// host:port; the sender connects, presents the link's token (kvpoold gave it to both: a connection
// without it is closed unread) and streams each piece of its arena; the receiver reads them into
// its target blocks and acknowledges once all are in place. The byte stream is docs/protocol.md's
// "Socket moves".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kvpool/arena/unique_fd.h"
#include "worker/paired_move.h"

namespace kvp {

struct SocketTransportOptions {
  std::string listen_address = "127.0.0.1";  // numeric IPv4 or IPv6 address the receiver binds
  uint64_t max_bytes_per_second = 0;         // the sender's pace; 0: as fast as TCP goes
  // A connection must present its header and token this soon, else the receiver closes it and
  // waits for the next: a peer that connects and sends nothing cannot hold the link until its
  // deadline. The sender writes them as soon as it is connected.
  std::chrono::milliseconds header_timeout{2000};
};

class SocketTransport : public PairedTransport {
 public:
  SocketTransport(OwnArena arena, SocketTransportOptions options)
      : arena_(arena), options_(std::move(options)) {}

  absl::StatusOr<std::string> Open(const MigrateWork& work) override;
  absl::Status Receive(const MigrateWork& work) override;
  absl::Status Send(const MigrateWork& work) override;

 private:
  OwnArena arena_;
  SocketTransportOptions options_;
  // From Open to the Receive of the same link (a worker runs one job at a time).
  UniqueFd listener_;
  uint64_t listener_link_ = 0;
};

}  // namespace kvp
