// What an attaching process learns with the arena's file descriptors (docs/design.md §2): the
// backend, the chunk sizes (one fd each, mapped back to back), the pool's layout and an epoch that
// changes whenever kvpoold restarts. A fixed little-endian binary form, versioned by a magic word.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/layout/pool_spec.h"

namespace kvp {

enum class ArenaKind : uint8_t { kHost = 1, kCuda = 2 };

inline constexpr int kMaxArenaChunks = 250;  // fds in one SCM_RIGHTS message (SCM_MAX_FD = 253)

struct ArenaDescription {
  ArenaKind kind = ArenaKind::kHost;
  uint64_t epoch = 0;
  // The pool's id, which stays the same across kvpoold restarts that keep the arena (its state
  // log names it; a worker handing the arena back says which pool it is). Version 2 and up.
  uint64_t arena_id = 0;
  int32_t device = -1;                // CUDA device ordinal of a cuda arena
  std::vector<uint64_t> chunk_bytes;  // one entry per fd, in mapping order
  int64_t num_blocks = 0;
  PoolSpec spec;

  uint64_t total_bytes() const;
};

std::string EncodeArenaDescription(const ArenaDescription& d);

// Reads versions 1 (arena_id 0) and 2. INVALID_ARGUMENT for a wrong magic/version, truncated
// input or an invalid PoolSpec.
absl::StatusOr<ArenaDescription> DecodeArenaDescription(absl::Span<const uint8_t> bytes);

}  // namespace kvp
