// Pool: the bookkeeping of one arena, as kvpoold holds it: the block layout, the allocator over
// the blocks that fit in the arena, the sequence tables and the leases, kept consistent with each
// other (a lease that ends takes its sequences, reservations and references with it).
// Not thread-safe: the daemon's loop owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/layout/block_layout.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/clock.h"
#include "kvpool/pool/lease_table.h"
#include "kvpool/pool/sequence_table.h"

namespace kvp {

class Pool {
 public:
  // A pool over `arena_bytes` of memory laid out by `spec`. INVALID_ARGUMENT for an invalid spec
  // or an arena too small for one block. REQUIRES: clock outlives the pool.
  static absl::StatusOr<std::unique_ptr<Pool>> Create(const PoolSpec& spec, uint64_t arena_bytes,
                                                      const Clock* clock,
                                                      int64_t lease_expiry_micros);

  const BlockLayout& layout() const { return layout_; }
  BlockAllocator& blocks() { return blocks_; }
  SequenceTable& sequences() { return sequences_; }
  LeaseTable& leases() { return leases_; }

  // Ends every lease whose holder stopped renewing it and gives back all it held. Returns them.
  std::vector<LeaseId> ReapExpiredLeases();

  // Ends `lease` now (its holder left cleanly) and gives back all it held.
  void EndLease(LeaseId lease);

  // The allocator's invariants and the tables' agreement with it (no block lost, none owned
  // twice, reference counts equal to the tables). O(blocks): for tests and fuzzers.
  absl::Status CheckInvariants() const;

 private:
  Pool(BlockLayout layout, int32_t num_blocks, const Clock* clock, int64_t lease_expiry_micros);

  BlockLayout layout_;
  BlockAllocator blocks_;
  SequenceTable sequences_;
  LeaseTable leases_;
};

}  // namespace kvp
