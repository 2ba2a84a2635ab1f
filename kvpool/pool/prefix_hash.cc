#include "kvpool/pool/prefix_hash.h"

namespace kvp {
namespace {

uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t ChainPrefixHash(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ tokens.size());
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

}  // namespace kvp
