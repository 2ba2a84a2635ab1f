// BlockAllocator: who owns every block of a pool, and in what state. The bookkeeping half of
// kvpoold's pool; it never touches block bytes.
//
// A block is in exactly one state:
//   free      - on the free list;
//   reserved  - taken by one lease for a write that is not committed yet (two-phase writes);
//   used      - committed, with references (each held by a lease);
//   cached    - committed, no references, kept for prefix hits; evicted least recently used
//               first when the free list runs out.
// Invariants (CheckInvariants verifies them; the property test runs it after every operation):
//   1. free + reserved + used + cached = total, and every block is in one of them once;
//   2. a block's reference count equals the references leases hold on it;
//   3. only committed blocks are readable, findable by prefix or referenced;
//   4. the prefix index maps a hash to one committed block whose tokens match.
// Not thread-safe: the daemon's loop owns it.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/pool/prefix_hash.h"

namespace kvp {

using BlockId = int32_t;
using LeaseId = uint64_t;

// A full block's place in the prefix chain (prefix_hash.h). All but `hash` rule out collisions.
struct PrefixKey {
  uint64_t hash = 0;
  uint64_t root = 0;            // its namespace
  std::vector<int32_t> tokens;  // the block's token ids
  TokenDigest content;          // what its K/V were made from
};

// What one lease holds: its reservations and its references (block -> count).
struct LeaseHoldings {
  absl::flat_hash_set<BlockId> reserved;
  absl::flat_hash_map<BlockId, int32_t> refs;
  bool empty() const { return reserved.empty() && refs.empty(); }
  friend bool operator==(const LeaseHoldings&, const LeaseHoldings&) = default;
};

struct PoolCounts {
  int64_t free = 0;
  int64_t reserved = 0;
  int64_t used = 0;
  int64_t cached = 0;
};

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }

  // Reserves n blocks for `lease`, from the free list first, then by evicting cached blocks
  // (least recently released first). RESOURCE_EXHAUSTED, taking nothing, when n cannot be met.
  absl::StatusOr<std::vector<BlockId>> Reserve(LeaseId lease, int n);

  // Reserved by `lease` -> used, with one reference held by `lease`. With `prefix`, the block
  // enters the prefix index unless a block with the same prefix is already there.
  absl::Status Commit(LeaseId lease, BlockId block, std::optional<PrefixKey> prefix);

  // Reserved by `lease` -> free.
  absl::Status Abort(LeaseId lease, BlockId block);

  // One more reference for `lease` on a committed block (a cached block becomes used again).
  absl::Status AddRef(LeaseId lease, BlockId block);

  // Enters a committed block into the prefix index (a block that filled up after its commit).
  // A no-op when a block with the same prefix is already indexed.
  absl::Status Index(BlockId block, PrefixKey prefix);

  // Drops one of `lease`'s references; at zero references the block becomes cached (indexed)
  // or free.
  absl::Status Release(LeaseId lease, BlockId block);

  // The committed block holding exactly this prefix, if any. Takes no reference.
  std::optional<BlockId> FindPrefix(const PrefixKey& key) const;

  // Aborts every reservation and drops every reference of `lease` (its process died or its lease
  // expired). Returns the number of reservations and references dropped.
  int64_t ReleaseLease(LeaseId lease);

  // Distinct blocks `lease` holds a reservation or a reference on.
  int64_t HeldBy(LeaseId lease) const;

  // The key `block` is indexed under, if it is in the prefix index: what a copy of it elsewhere
  // may be found by.
  std::optional<PrefixKey> PrefixOf(BlockId block) const;

  bool IsCommitted(BlockId block) const;
  int32_t RefCount(BlockId block) const;
  PoolCounts counts() const { return counts_; }
  // Cached blocks evicted to make room since this allocator was made (not restored: a counter).
  uint64_t evictions() const { return evictions_; }

  // Checks invariants 1-4 over the whole pool; O(blocks). For tests and debug builds.
  absl::Status CheckInvariants() const;

  // Every lease's holdings that are not empty, copied: for checks against the sequence tables.
  absl::flat_hash_map<LeaseId, LeaseHoldings> Holdings() const;

  // ---- Persistence (kvpoold's state log, docs/design.md §10) ----
  // From now on every block that enters or leaves the prefix index is added to `indexed`, every
  // block reserved or no longer reserved to `reserved` (null: stop). REQUIRES: the sets outlive
  // the allocator or the next call.
  void TrackChanges(absl::flat_hash_set<BlockId>* indexed, absl::flat_hash_set<BlockId>* reserved) {
    index_changes_ = indexed;
    reserve_changes_ = reserved;
  }
  bool IsReserved(BlockId block) const {
    return block >= 0 && block < num_blocks() && blocks_[block].state == State::kReserved;
  }
  // Every indexed block and its key: cached ones first, least recently released first, then the
  // used ones.
  std::vector<std::pair<BlockId, PrefixKey>> Indexed() const;
  // A pool as the log recorded it: `indexed` blocks in the order Indexed() gives, one reference
  // per (lease, block) entry of `refs`, and `reserved` blocks reserved by `reserved_by`.
  // Referenced blocks are used, indexed ones without references cached, the rest free.
  // DATA_LOSS for a block out of range, indexed twice, reserved and committed, or two blocks
  // under one hash.
  static absl::StatusOr<BlockAllocator> Restore(
      int32_t num_blocks, std::vector<std::pair<BlockId, PrefixKey>> indexed,
      const std::vector<std::pair<LeaseId, BlockId>>& refs, const std::vector<BlockId>& reserved,
      LeaseId reserved_by);

 private:
  enum class State : uint8_t { kFree, kReserved, kUsed, kCached };
  struct Block {
    State state = State::kFree;
    int32_t refs = 0;
    LeaseId reserved_by = 0;
    bool indexed = false;
    PrefixKey prefix;
    std::list<BlockId>::iterator lru;  // valid while cached
  };

  absl::Status CheckBlock(BlockId block) const;
  void Evict(BlockId block);    // cached -> free-floating (caller reuses it)
  void IndexChanged(BlockId block) {
    if (index_changes_ != nullptr) index_changes_->insert(block);
  }
  void ReserveChanged(BlockId block) {
    if (reserve_changes_ != nullptr) reserve_changes_->insert(block);
  }
  void DropRef(BlockId block);  // one reference less, state follows

  std::vector<Block> blocks_;
  std::vector<BlockId> free_;
  std::list<BlockId> lru_;  // cached blocks, least recently released first
  absl::flat_hash_map<uint64_t, BlockId> prefix_index_;
  absl::flat_hash_map<LeaseId, LeaseHoldings> leases_;
  PoolCounts counts_;
  uint64_t evictions_ = 0;
  absl::flat_hash_set<BlockId>* index_changes_ = nullptr;
  absl::flat_hash_set<BlockId>* reserve_changes_ = nullptr;
};

}  // namespace kvp
