// Block tables in decode jobs are sent as deltas (kvpool.capnp, DecodeJobStep): a worker keeps the
// table it last got for each sequence, and a step names how many leading blocks still hold plus
// the rest. Long contexts change by one block at a time, so a 64-sequence step of 32k tokens
// carries a few hundred bytes of tables instead of 131 KB. The hash lets the worker check that
// what it rebuilt is what kvpoold meant.
//
// Both sides keep each table as a HeldBlockTable, whose hash is a running fold: a step that only
// appends costs the length of what it appends, not of the whole table (a 64 x 512-block step
// would otherwise hash 32,768 entries on each side, on the critical path of every decode step).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace kvp {

namespace block_table_hash {
inline constexpr uint64_t kSeed = 0x6B7670BD1E7AB1E5ull;
inline uint64_t Fold(uint64_t state, std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    state ^= static_cast<uint32_t>(b);
    state *= 0x100000001B3ull;  // FNV-1a's prime, over 32-bit words
    state ^= state >> 29;
  }
  return state;
}
// The fold so far and the table's length, mixed so that tables of different lengths differ.
inline uint64_t Digest(uint64_t state, size_t size) {
  uint64_t h = state ^ (static_cast<uint64_t>(size) * 0x9E3779B97F4A7C15ull);
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}
}  // namespace block_table_hash

inline uint64_t BlockTableHash(std::span<const int32_t> table) {
  return block_table_hash::Digest(block_table_hash::Fold(block_table_hash::kSeed, table),
                                  table.size());
}

// Leading entries `a` and `b` share. A table that only grew is found with one memcmp.
inline size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  if (a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin())) return a.size();
  if (b.size() < a.size() && std::equal(b.begin(), b.end(), a.begin())) return b.size();
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first -
                             a.begin());
}

// One sequence's table as last sent (kvpoold) or received (a worker), with its hash.
class HeldBlockTable {
 public:
  std::span<const int32_t> blocks() const { return blocks_; }
  size_t size() const { return blocks_.size(); }
  uint64_t hash() const { return block_table_hash::Digest(state_, blocks_.size()); }

  // Keeps the first `keep` blocks and appends `tail`. Appending costs tail's length; cutting
  // (a copy-on-write replaced a block) refolds what is kept. REQUIRES: keep <= size().
  void Replace(size_t keep, std::span<const int32_t> tail) {
    if (keep < blocks_.size()) {
      blocks_.resize(keep);
      state_ = block_table_hash::Fold(block_table_hash::kSeed, blocks_);
    }
    blocks_.insert(blocks_.end(), tail.begin(), tail.end());
    state_ = block_table_hash::Fold(state_, tail);
  }

 private:
  std::vector<int32_t> blocks_;
  uint64_t state_ = block_table_hash::kSeed;  // Fold over blocks_
};

}  // namespace kvp
