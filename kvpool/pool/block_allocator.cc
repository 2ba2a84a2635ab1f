#include "kvpool/pool/block_allocator.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvp {

BlockAllocator::BlockAllocator(int32_t num_blocks) : blocks_(num_blocks) {
  free_.reserve(num_blocks);
  // Hand out low ids first: the free list is a stack.
  for (BlockId b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  counts_.free = num_blocks;
}

absl::Status BlockAllocator::CheckBlock(BlockId block) const {
  if (block < 0 || block >= num_blocks()) {
    return absl::OutOfRangeError(
        absl::StrCat("block ", block, " is out of range; the pool has ", num_blocks(), " blocks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockId>> BlockAllocator::Reserve(LeaseId lease, int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("cannot reserve ", n, " blocks"));
  if (static_cast<int64_t>(free_.size()) + counts_.cached < n) {
    return absl::ResourceExhaustedError(absl::StrCat("pool full: ", n, " blocks asked, ",
                                                     free_.size(), " free and ", counts_.cached,
                                                     " evictable"));
  }
  std::vector<BlockId> out;
  out.reserve(n);
  LeaseHoldings& h = leases_[lease];
  for (int i = 0; i < n; ++i) {
    BlockId b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
      --counts_.free;
    } else {
      b = lru_.front();
      Evict(b);
    }
    Block& blk = blocks_[b];
    blk.state = State::kReserved;
    blk.reserved_by = lease;
    h.reserved.insert(b);
    ++counts_.reserved;
    out.push_back(b);
    ReserveChanged(b);
  }
  return out;
}

void BlockAllocator::Evict(BlockId b) {
  Block& blk = blocks_[b];
  lru_.erase(blk.lru);
  if (blk.indexed) {
    prefix_index_.erase(blk.prefix.hash);
    IndexChanged(b);
  }
  blk.indexed = false;
  blk.prefix = PrefixKey();
  --counts_.cached;
  ++evictions_;
}

absl::Status BlockAllocator::Commit(LeaseId lease, BlockId block, std::optional<PrefixKey> prefix) {
  if (absl::Status s = CheckBlock(block); !s.ok()) return s;
  Block& blk = blocks_[block];
  if (blk.state != State::kReserved || blk.reserved_by != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("block ", block, " is not reserved by lease ", lease));
  }
  LeaseHoldings& h = leases_[lease];
  h.reserved.erase(block);
  ReserveChanged(block);
  ++h.refs[block];
  blk.state = State::kUsed;
  blk.refs = 1;
  --counts_.reserved;
  ++counts_.used;
  if (prefix.has_value() && !prefix_index_.contains(prefix->hash)) {
    prefix_index_.emplace(prefix->hash, block);
    blk.indexed = true;
    blk.prefix = *std::move(prefix);
    IndexChanged(block);
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::Index(BlockId block, PrefixKey prefix) {
  if (absl::Status s = CheckBlock(block); !s.ok()) return s;
  Block& blk = blocks_[block];
  if (blk.state != State::kUsed && blk.state != State::kCached) {
    return absl::FailedPreconditionError(absl::StrCat("block ", block, " is not committed"));
  }
  if (blk.indexed || prefix_index_.contains(prefix.hash)) return absl::OkStatus();
  prefix_index_.emplace(prefix.hash, block);
  blk.indexed = true;
  blk.prefix = std::move(prefix);
  IndexChanged(block);
  return absl::OkStatus();
}

absl::Status BlockAllocator::Abort(LeaseId lease, BlockId block) {
  if (absl::Status s = CheckBlock(block); !s.ok()) return s;
  Block& blk = blocks_[block];
  if (blk.state != State::kReserved || blk.reserved_by != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("block ", block, " is not reserved by lease ", lease));
  }
  leases_[lease].reserved.erase(block);
  ReserveChanged(block);
  blk.state = State::kFree;
  blk.reserved_by = 0;
  free_.push_back(block);
  --counts_.reserved;
  ++counts_.free;
  return absl::OkStatus();
}

absl::Status BlockAllocator::AddRef(LeaseId lease, BlockId block) {
  if (absl::Status s = CheckBlock(block); !s.ok()) return s;
  Block& blk = blocks_[block];
  if (blk.state == State::kCached) {
    lru_.erase(blk.lru);
    blk.state = State::kUsed;
    --counts_.cached;
    ++counts_.used;
  } else if (blk.state != State::kUsed) {
    return absl::FailedPreconditionError(absl::StrCat("block ", block, " is not committed"));
  }
  ++blk.refs;
  ++leases_[lease].refs[block];
  return absl::OkStatus();
}

void BlockAllocator::DropRef(BlockId block) {
  Block& blk = blocks_[block];
  if (--blk.refs > 0) return;
  --counts_.used;
  if (blk.indexed) {
    blk.state = State::kCached;
    blk.lru = lru_.insert(lru_.end(), block);
    ++counts_.cached;
  } else {
    blk.state = State::kFree;
    free_.push_back(block);
    ++counts_.free;
  }
}

absl::Status BlockAllocator::Release(LeaseId lease, BlockId block) {
  if (absl::Status s = CheckBlock(block); !s.ok()) return s;
  if (auto h = leases_.find(lease); h != leases_.end()) {
    if (auto r = h->second.refs.find(block); r != h->second.refs.end()) {
      if (--r->second == 0) h->second.refs.erase(r);
      DropRef(block);
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("lease ", lease, " holds no reference to block ", block));
}

int64_t BlockAllocator::HeldBy(LeaseId lease) const {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return 0;
  return static_cast<int64_t>(it->second.reserved.size() + it->second.refs.size());
}

std::optional<BlockId> BlockAllocator::FindPrefix(const PrefixKey& wanted) const {
  auto it = prefix_index_.find(wanted.hash);
  if (it == prefix_index_.end()) return std::nullopt;
  const PrefixKey& key = blocks_[it->second].prefix;
  // A 64-bit collision must never share a block of another namespace, tokens or content.
  if (key.root != wanted.root || key.tokens != wanted.tokens || !(key.content == wanted.content)) {
    return std::nullopt;
  }
  return it->second;
}

int64_t BlockAllocator::ReleaseLease(LeaseId lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return 0;
  LeaseHoldings h = std::move(it->second);
  leases_.erase(it);
  int64_t dropped = 0;
  for (BlockId block : h.reserved) {
    ReserveChanged(block);
    Block& blk = blocks_[block];
    blk.state = State::kFree;
    blk.reserved_by = 0;
    free_.push_back(block);
    --counts_.reserved;
    ++counts_.free;
    ++dropped;
  }
  for (const auto& [block, refs] : h.refs) {
    for (int32_t i = 0; i < refs; ++i) DropRef(block);
    dropped += refs;
  }
  return dropped;
}

std::optional<PrefixKey> BlockAllocator::PrefixOf(BlockId block) const {
  if (block < 0 || block >= num_blocks() || !blocks_[block].indexed) return std::nullopt;
  return blocks_[block].prefix;
}

bool BlockAllocator::IsCommitted(BlockId block) const {
  if (block < 0 || block >= num_blocks()) return false;
  const State s = blocks_[block].state;
  return s == State::kUsed || s == State::kCached;
}

int32_t BlockAllocator::RefCount(BlockId block) const {
  return block < 0 || block >= num_blocks() ? 0 : blocks_[block].refs;
}

absl::flat_hash_map<LeaseId, LeaseHoldings> BlockAllocator::Holdings() const {
  absl::flat_hash_map<LeaseId, LeaseHoldings> out;
  for (const auto& [lease, h] : leases_) {
    if (!h.empty()) out.emplace(lease, h);
  }
  return out;
}

std::vector<std::pair<BlockId, PrefixKey>> BlockAllocator::Indexed() const {
  std::vector<std::pair<BlockId, PrefixKey>> out;
  out.reserve(prefix_index_.size());
  for (BlockId b : lru_) out.emplace_back(b, blocks_[b].prefix);
  for (BlockId b = 0; b < num_blocks(); ++b) {
    if (blocks_[b].indexed && blocks_[b].state == State::kUsed) {
      out.emplace_back(b, blocks_[b].prefix);
    }
  }
  return out;
}

absl::StatusOr<BlockAllocator> BlockAllocator::Restore(
    int32_t num_blocks, std::vector<std::pair<BlockId, PrefixKey>> indexed,
    const std::vector<std::pair<LeaseId, BlockId>>& refs, const std::vector<BlockId>& reserved,
    LeaseId reserved_by) {
  BlockAllocator a(num_blocks);
  const auto in_range = [&](BlockId b) { return b >= 0 && b < num_blocks; };
  for (BlockId b : reserved) {
    if (!in_range(b) || a.blocks_[b].state != State::kFree) {
      return absl::DataLossError(absl::StrCat("block ", b, " is reserved twice or out of range"));
    }
    a.blocks_[b].state = State::kReserved;
    a.blocks_[b].reserved_by = reserved_by;
    a.leases_[reserved_by].reserved.insert(b);
  }
  for (const auto& [lease, b] : refs) {
    if (!in_range(b) || a.blocks_[b].state == State::kReserved) {
      return absl::DataLossError(absl::StrCat("a sequence references block ", b, " of a pool of ",
                                              num_blocks, ", out of range or reserved"));
    }
    Block& blk = a.blocks_[b];
    blk.state = State::kUsed;
    ++blk.refs;
    ++a.leases_[lease].refs[b];
  }
  for (auto& [b, key] : indexed) {
    if (!in_range(b) || a.blocks_[b].indexed || a.blocks_[b].state == State::kReserved) {
      return absl::DataLossError(
          absl::StrCat("block ", b, " is indexed twice, reserved or out of range"));
    }
    if (!a.prefix_index_.emplace(key.hash, b).second) {
      return absl::DataLossError(absl::StrCat("two blocks are indexed under hash ", key.hash));
    }
    Block& blk = a.blocks_[b];
    blk.indexed = true;
    blk.prefix = std::move(key);
    if (blk.state == State::kFree) {
      blk.state = State::kCached;
      blk.lru = a.lru_.insert(a.lru_.end(), b);
    }
  }
  a.free_.clear();
  a.counts_ = PoolCounts();
  for (BlockId b = num_blocks - 1; b >= 0; --b) {
    switch (a.blocks_[b].state) {
      case State::kFree:
        a.free_.push_back(b);
        ++a.counts_.free;
        break;
      case State::kUsed:
        ++a.counts_.used;
        break;
      case State::kCached:
        ++a.counts_.cached;
        break;
      case State::kReserved:
        ++a.counts_.reserved;
        break;
    }
  }
  return a;
}

absl::Status BlockAllocator::CheckInvariants() const {
  PoolCounts seen;
  std::vector<int32_t> held(blocks_.size(), 0);
  std::vector<int32_t> reserved_by_leases(blocks_.size(), 0);
  for (const auto& [lease, h] : leases_) {
    for (BlockId block : h.reserved) {
      ++reserved_by_leases[block];
      if (blocks_[block].reserved_by != lease) {
        return absl::InternalError(absl::StrCat("block ", block, " reserved by two owners"));
      }
    }
    for (const auto& [block, refs] : h.refs) held[block] += refs;
  }
  std::vector<int32_t> on_free(blocks_.size(), 0), on_lru(blocks_.size(), 0);
  for (BlockId b : free_) ++on_free[b];
  for (BlockId b : lru_) ++on_lru[b];
  for (BlockId b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    const bool free = blk.state == State::kFree, cached = blk.state == State::kCached;
    if (on_free[b] != (free ? 1 : 0) || on_lru[b] != (cached ? 1 : 0)) {
      return absl::InternalError(absl::StrCat("block ", b, " is on the wrong list"));
    }
    if (reserved_by_leases[b] != (blk.state == State::kReserved ? 1 : 0)) {
      return absl::InternalError(absl::StrCat("block ", b, " has a wrong reservation count"));
    }
    if (blk.refs != held[b] || (blk.state == State::kUsed) != (blk.refs > 0)) {
      return absl::InternalError(
          absl::StrCat("block ", b, " has ", blk.refs, " references but leases hold ", held[b]));
    }
    if (cached && !blk.indexed)
      return absl::InternalError(absl::StrCat("unindexed cached block ", b));
    if (blk.indexed) {
      auto it = prefix_index_.find(blk.prefix.hash);
      if (it == prefix_index_.end() || it->second != b || free || blk.state == State::kReserved) {
        return absl::InternalError(absl::StrCat("block ", b, " disagrees with the prefix index"));
      }
    }
    switch (blk.state) {
      case State::kFree:
        ++seen.free;
        break;
      case State::kReserved:
        ++seen.reserved;
        break;
      case State::kUsed:
        ++seen.used;
        break;
      case State::kCached:
        ++seen.cached;
        break;
    }
  }
  if (static_cast<int64_t>(prefix_index_.size()) > seen.used + seen.cached) {
    return absl::InternalError("the prefix index names blocks that are not committed");
  }
  if (seen.free != counts_.free || seen.reserved != counts_.reserved || seen.used != counts_.used ||
      seen.cached != counts_.cached ||
      seen.free + seen.reserved + seen.used + seen.cached != num_blocks()) {
    return absl::InternalError("state counts do not add up");
  }
  return absl::OkStatus();
}

}  // namespace kvp
