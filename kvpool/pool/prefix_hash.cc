#include "kvpool/pool/prefix_hash.h"

#include <algorithm>

namespace kvp {
namespace {

uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

TokenDigest BlockDigest(absl::Span<const TokenDigest> tokens) {
  if (std::all_of(tokens.begin(), tokens.end(),
                  [](const TokenDigest& d) { return d == kSyntheticTokenDigest; })) {
    return kSyntheticTokenDigest;
  }
  // Two independent chains over digests an attacker cannot choose (they are keyed): a block
  // digest equal to another's needs equal token digests in the same order.
  TokenDigest out{Mix(tokens.size()), Mix(~tokens.size())};
  for (const TokenDigest& d : tokens) {
    out.lo = Mix(out.lo ^ d.lo) ^ d.hi;
    out.hi = Mix(out.hi ^ d.hi) ^ d.lo;
  }
  return out;
}

uint64_t ChainPrefixHash(uint64_t parent, absl::Span<const int32_t> tokens,
                         const TokenDigest& content) {
  uint64_t h = Mix(parent ^ tokens.size());
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return Mix(Mix(h ^ content.lo) ^ content.hi);
}

}  // namespace kvp
