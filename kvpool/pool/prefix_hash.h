// The prefix hash chain: a full block's key is (parent block's hash, the block's token ids), so
// equal hashes mean equal prefixes up to and including the block (modulo 64-bit collisions,
// which the prefix index rules out by comparing token ids).
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace kvp {

inline constexpr uint64_t kRootPrefixHash = 0x6B76706F6F6C5248ull;

uint64_t ChainPrefixHash(uint64_t parent, absl::Span<const int32_t> tokens);

}  // namespace kvp
