// How kvpoold starts with a state directory (docs/design.md §10): it adopts the arenas its last
// run left in systemd's fd store and restores their bookkeeping from the state log, or, when
// anything does not match, starts empty and says why.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/fd_store.h"
#include "daemon/served_arena.h"
#include "daemon/state/state_log.h"
#include "kvpool/pool/pool_set.h"

namespace kvp {

// What this start's flags ask for; a logged state is adopted only when it is exactly this.
struct PoolsAsked {
  PoolSpec spec;
  int64_t block_stride = 0;
  std::vector<int32_t> gpus;  // per pool; -1: host
  uint64_t arena_bytes = 0;
};

// The arenas `header` describes, their chunks taken from `store` and mapped again.
// FAILED_PRECONDITION naming the first difference from `asked` or the first missing chunk.
absl::StatusOr<std::vector<std::unique_ptr<ServedArena>>> AdoptArenas(const StateHeader& header,
                                                                      const PoolsAsked& asked,
                                                                      FdStore& store);

// New random pool ids for `arenas`, with their GPUs and chunks.
std::vector<PoolIdentity> NewPoolIdentities(
    const std::vector<std::unique_ptr<ServedArena>>& arenas, int32_t num_blocks);

// Keeps a duplicate of every chunk fd in `store`, named by ChunkFdName.
absl::Status StoreArenas(const std::vector<std::unique_ptr<ServedArena>>& arenas,
                         const std::vector<PoolIdentity>& ids, FdStore& store);

struct RestoredPools {
  uint64_t sequences = 0;
  uint64_t blocks = 0;          // committed: used and cached
  LeaseId quarantine = 0;       // holds the reserved blocks; 0: there were none
  std::vector<uint32_t> pids;   // the workers whose jobs may write them
  std::vector<LeaseId> old_workers;  // the last run's worker leases, ended now
};

// Restores `state` into `pools` (empty, of the header's layout): the sequences and prefix index
// of each pool, the client leases alive for `grace_micros` at least, and the reserved blocks under
// a quarantine lease of `quarantine_micros`. DATA_LOSS when the state is inconsistent; `pools` is
// then empty again.
absl::StatusOr<RestoredPools> RestorePools(RecoveredState state, PoolSet& pools,
                                           int64_t grace_micros, int64_t quarantine_micros);

}  // namespace kvp
