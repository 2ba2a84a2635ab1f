// PoolSet: kvpoold's pools (one per GPU, or memfd pools on the host backend; docs/design.md §2)
// and the leases they share. A lease is the process's, not a pool's: a client's sequences may
// live in any pool, and ending its lease gives back what it held in each of them.
//
// A sequence lives in one pool, its home, apart from a migration in flight: then the destination
// also holds it, as a pending Import (sequence_table.h), until the move commits there and the
// source lets it go. Sequence ids are kvpoold-wide: no two homes hold the same id.
// Not thread-safe: the daemon's loop owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "kvpool/pool/clock.h"
#include "kvpool/pool/lease_table.h"
#include "kvpool/pool/pool.h"

namespace kvp {

using PoolIndex = uint32_t;

class PoolSet {
 public:
  // `num_pools` pools of `arena_bytes` each, all laid out by `spec`. INVALID_ARGUMENT as
  // Pool::Create, or for no pool at all. REQUIRES: clock outlives the set.
  static absl::StatusOr<std::unique_ptr<PoolSet>> Create(const PoolSpec& spec,
                                                         uint64_t arena_bytes, int num_pools,
                                                         const Clock* clock,
                                                         int64_t lease_expiry_micros);

  size_t size() const { return pools_.size(); }
  Pool& pool(PoolIndex i) { return *pools_[i]; }
  const Pool& pool(PoolIndex i) const { return *pools_[i]; }
  // Every pool has the same layout.
  const BlockLayout& layout() const { return pools_.front()->layout(); }
  LeaseTable& leases() { return leases_; }
  const LeaseTable& leases() const { return leases_; }

  // The pool `seq` lives in (not one it is being moved to); nullopt when it is nowhere.
  std::optional<PoolIndex> Home(SeqId seq) const;

  // Gives back all `lease` held in every pool (the lease itself is the caller's to end).
  void ForgetLease(LeaseId lease);

  // Summed over the pools.
  PoolCounts counts() const;
  int64_t HeldBy(LeaseId lease) const;
  size_t num_sequences() const;  // homes only

  // ---- Persistence (kvpoold's state log, docs/design.md §10) ----
  struct Changes {
    std::vector<PoolChanges> pools;     // one per pool
    absl::flat_hash_set<LeaseId> leases;  // client leases granted or ended
  };
  // Starts recording what changes in the pools' committed state and the client leases.
  void TrackChanges();
  bool tracking_changes() const { return tracking_; }
  // What changed since the last call (or TrackChanges).
  Changes TakeChanges();

  // Every pool's invariants, and that no sequence has two homes. O(blocks).
  absl::Status CheckInvariants() const;

 private:
  PoolSet(std::vector<std::unique_ptr<Pool>> pools, const Clock* clock,
          int64_t lease_expiry_micros);

  std::vector<std::unique_ptr<Pool>> pools_;
  LeaseTable leases_;
  absl::flat_hash_set<LeaseId> lease_changes_;
  bool tracking_ = false;
};

}  // namespace kvp
