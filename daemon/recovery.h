// How kvpoold starts with a state directory (docs/design.md §10): it adopts the arenas its last
// run left in systemd's fd store and restores their bookkeeping from the state log, or, when
// anything does not match, starts empty and says why.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/fd_store.h"
#include "kvpool/arena/fd_channel.h"
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

// OK when `header` describes the pools `asked` for; FAILED_PRECONDITION naming the difference.
absl::Status CheckLoggedPools(const StateHeader& header, const PoolsAsked& asked);

// Each logged pool's chunk fds, taken from `store`; nullopt for a pool whose chunks are not all
// there.
std::vector<std::optional<std::vector<UniqueFd>>> TakeStoredChunks(const StateHeader& header,
                                                                   FdStore& store);

// Waits up to `timeout_ms` on a return channel at `path` (ReturnChannelIn) for workers to hand
// back the chunks of the pools still missing in `chunks` (docs/design.md §10). A worker sends the
// description it attached with and its fds; kvpoold takes them when the description's arena id
// is a missing pool's and its chunks are the logged ones, and answers "ok" (or why not).
void AwaitHandBack(const StateHeader& header, const std::string& path, const AllowList& allow,
                   int timeout_ms, std::vector<std::optional<std::vector<UniqueFd>>>& chunks);

// The logged pools' arenas from their chunk fds (one entry per pool, all present), mapped again.
// FAILED_PRECONDITION when a chunk is not what the log says (size, kind, device).
absl::StatusOr<std::vector<std::unique_ptr<ServedArena>>> AdoptArenas(
    const StateHeader& header, std::vector<std::optional<std::vector<UniqueFd>>> chunks);

// New random pool ids for `arenas`, with their GPUs and chunks.
std::vector<PoolIdentity> NewPoolIdentities(
    const std::vector<std::unique_ptr<ServedArena>>& arenas, int32_t num_blocks);

// Keeps a duplicate of every chunk fd of the pools in `which` (all: empty) in `store`, named by
// ChunkFdName.
absl::Status StoreArenas(const std::vector<std::unique_ptr<ServedArena>>& arenas,
                         const std::vector<PoolIdentity>& ids, FdStore& store,
                         const std::vector<size_t>& which = {});

struct RestoredPools {
  uint64_t sequences = 0;
  uint64_t blocks = 0;          // committed: used and cached
  LeaseId quarantine = 0;       // holds the reserved blocks; 0: there were none
  std::vector<uint32_t> pids;   // the workers whose jobs may write them
  // The last run's worker leases, to be logged as ended (not while a quarantine waits for them).
  std::vector<LeaseId> old_workers;
};

// Restores `state` into `pools` (empty, of the header's layout): the sequences and prefix index
// of each pool, the client leases alive for `grace_micros` at least, and the reserved blocks under
// a quarantine lease of `quarantine_micros`. DATA_LOSS when the state is inconsistent; `pools` is
// then empty again.
absl::StatusOr<RestoredPools> RestorePools(RecoveredState state, PoolSet& pools,
                                           int64_t grace_micros, int64_t quarantine_micros);

}  // namespace kvp
