// Pool: the bookkeeping of one arena, as kvpoold holds it: the block layout, the allocator over
// the blocks that fit in the arena and the sequence tables, kept consistent with each other.
// Leases are kvpoold's, shared by all its pools (pool_set.h). Not thread-safe: the daemon's loop
// owns it.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kvpool/layout/block_layout.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/sequence_table.h"

namespace kvp {

class Pool {
 public:
  // A pool over `arena_bytes` of memory laid out by `spec`. INVALID_ARGUMENT for an invalid spec
  // or an arena too small for one block.
  static absl::StatusOr<std::unique_ptr<Pool>> Create(const PoolSpec& spec, uint64_t arena_bytes);

  const BlockLayout& layout() const { return layout_; }
  BlockAllocator& blocks() { return blocks_; }
  const BlockAllocator& blocks() const { return blocks_; }
  SequenceTable& sequences() { return sequences_; }
  const SequenceTable& sequences() const { return sequences_; }

  // Gives back all `lease` held here: its sequences, reservations and references.
  void ForgetLease(LeaseId lease);

  // The allocator's invariants and the tables' agreement with it (no block lost, none owned
  // twice, reference counts equal to the tables). O(blocks): for tests and fuzzers.
  absl::Status CheckInvariants() const;

 private:
  Pool(BlockLayout layout, int32_t num_blocks);

  BlockLayout layout_;
  BlockAllocator blocks_;
  SequenceTable sequences_;
};

}  // namespace kvp
