// A paired move (docs/design.md §6): the nccl and socket transports move a migration's bytes
// between two workers, a sender of the source pool and a receiver of the destination pool, over a
// link kvpoold pairs them on (worker/migration.h: the work and its pieces).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/migration.h"

namespace kvp {

// This worker's own arena, as a paired transport reads (sender) or writes (receiver) it.
struct OwnArena {
  uint8_t* base = nullptr;  // host memory, or device memory of `device`
  int64_t num_blocks = 0;
  int64_t block_stride = 0;
  int device = -1;
};

// A transport that moves bytes between the two workers of a link. Each call returns by the
// link's deadline; a failure leaves nothing committed (kvpoold aborts the destination's
// reservation) and the link unusable (kvpoold opens a fresh one next time).
class PairedTransport {
 public:
  virtual ~PairedTransport() = default;
  // Receiver of a fresh link: opens it and says how the sender joins (an ncclUniqueId, or
  // host:port), for kvpoold to relay.
  virtual absl::StatusOr<std::string> Open(const MigrateWork& work) = 0;
  // Returns once every moved byte is in this worker's arena.
  virtual absl::Status Receive(const MigrateWork& work) = 0;
  // Returns once the receiver has them.
  virtual absl::Status Send(const MigrateWork& work) = 0;
};

}  // namespace kvp
