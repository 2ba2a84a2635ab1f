// Block tables in decode jobs are sent as deltas (kvpool.capnp, DecodeJobStep): a worker keeps the
// table it last got for each sequence, and a step names how many leading blocks still hold plus
// the rest. Long contexts change by one block at a time, so a 64-sequence step of 32k tokens
// carries a few hundred bytes of tables instead of 131 KB. The hash lets the worker check that
// what it rebuilt is what kvpoold meant.
#pragma once

#include <cstdint>
#include <span>

namespace kvp {

inline uint64_t BlockTableHash(std::span<const int32_t> table) {
  uint64_t h = 0x6B7670BD1E7AB1E5ull ^ table.size();
  for (int32_t b : table) {
    h ^= static_cast<uint32_t>(b);
    h *= 0x100000001B3ull;  // FNV-1a's prime, over 32-bit words
    h ^= h >> 29;
  }
  return h;
}

// Leading entries `a` and `b` share.
inline size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace kvp
