// Pool: the bookkeeping of one arena, as kvpoold holds it: the block layout, the allocator over
// the blocks that fit in the arena and the sequence tables, kept consistent with each other.
// Leases are kvpoold's, shared by all its pools (pool_set.h). Not thread-safe: the daemon's loop
// owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/layout/block_layout.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/sequence_table.h"

namespace kvp {

// A pool's state as kvpoold's state log keeps it (docs/design.md §10): its committed sequences,
// its prefix index (BlockAllocator::Indexed order) and which blocks are reserved (a job may be
// writing them). Everything else follows from these.
struct PoolImage {
  std::vector<std::pair<SeqId, CommittedSequence>> sequences;
  std::vector<std::pair<BlockId, PrefixKey>> indexed;
  std::vector<BlockId> reserved;
};

// What changed in a pool's image since the changes were last taken.
struct PoolChanges {
  absl::flat_hash_set<SeqId> sequences;
  absl::flat_hash_set<BlockId> indexed;   // entered or left the prefix index
  absl::flat_hash_set<BlockId> reserved;  // reserved, or no longer
  bool empty() const { return sequences.empty() && indexed.empty() && reserved.empty(); }
};

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

  // Starts recording changes (TakeChanges hands them over).
  void TrackChanges();
  PoolChanges TakeChanges() { return std::exchange(changes_, PoolChanges()); }
  // The committed state, for a snapshot. O(sequences + blocks).
  PoolImage Capture() const;
  // Replaces this pool's state with `image` (a pool of the same layout, from the state log): every
  // sequence committed, the image's reserved blocks held by lease `quarantine` (a job of the
  // last kvpoold may still write them; ForgetLease(quarantine) frees them). DATA_LOSS, leaving
  // the pool empty, when the image is not a consistent pool (the invariants are checked).
  absl::Status Restore(PoolImage image, LeaseId quarantine);

  // The allocator's invariants and the tables' agreement with it (no block lost, none owned
  // twice, reference counts equal to the tables). O(blocks): for tests and fuzzers.
  absl::Status CheckInvariants() const;

 private:
  Pool(BlockLayout layout, int32_t num_blocks);

  BlockLayout layout_;
  BlockAllocator blocks_;
  SequenceTable sequences_;
  PoolChanges changes_;
  bool tracking_ = false;
  LeaseHoldings quarantined_;  // reservations Restore took over, until ForgetLease(quarantine_)
  LeaseId quarantine_ = 0;
};

}  // namespace kvp
